//! `locks run --min-hold`: the lock kept after the command, until the
//! minimum has passed since it was acquired.

use std::time::{Duration, Instant};

use volcano::{HeldLock, LockLost};

use crate::child::Signals;

/// `--min-hold`: after the command, keeps the lock until the minimum has
/// passed since it was acquired, a loss, or a signal to the CLI (which
/// releases at once). `None` without a minimum; else the loss, if any,
/// when the command ended: what the summary reports, with a loss to
/// another holder during the minimum (when the key was taken cannot be
/// told).
pub(crate) async fn keep_min_hold(
    held: &HeldLock,
    started: Instant,
    min_hold: Option<Duration>,
    signals: &mut Signals,
) -> Option<Kept> {
    let min = min_hold?;
    let covered = held.failure();
    if covered.is_none() {
        let until = tokio::time::Instant::from_std(started + min);
        tokio::select! {
            _ = held.lost() => {}
            () = tokio::time::sleep_until(until) => {}
            _ = signals.next() => {}
        }
    }
    Some(Kept { covered })
}

/// A minimum hold that was kept: the loss, if any, when the command ended.
pub(crate) struct Kept {
    pub(crate) covered: Option<LockLost>,
}

/// A loss that shows another holder, as opposed to an expiry, a failing
/// service or a cap.
pub(crate) fn taken_by_another(lost: &LockLost) -> bool {
    lost.reason() == volcano::LostReason::TakenOver
        || lost
            .cause()
            .is_some_and(|cause| cause.is_ownership_lost() || cause.is_lock_held())
}
