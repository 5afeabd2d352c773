//! The belief margin: for every loss a guard reported on its own (its
//! lease expired, its renewals failed or were refused, no safe window
//! was left to renew in), how long before the server's expiry of that
//! lease the guard said it was lost. Never negative on an exact clock
//! (`safety::within_lease` fails the run otherwise); its distribution over
//! many seeds says how much of a lease the SDK gives up to be safe.

use std::time::Duration;

use super::run::Run;
use super::safety::{expiry_granted, granted_at};
use crate::log::Event;

/// How a belief ended, in the log's words, when the guard found the loss
/// itself (not a release, a cap or the program giving up).
const LOSSES: [&str; 4] = ["Expired", "RenewalFailed", "NoSafeWindow", "TakenOver"];

/// The margin of every loss in the run, in milliseconds (the server's
/// expiry minus the moment the loss was told), except where a
/// force-release or a server clock jump moved the lease under the guard.
pub(super) fn of_losses(run: &Run<'_>) -> Vec<i64> {
    let mut margins = Vec::new();
    for b in &run.beliefs {
        let lost = run.events.iter().any(|e| {
            e.at == b.to
                && matches!(&e.event, Event::Ended { client, key, fence, why }
                    if *client == b.client && *key == b.key && *fence == b.fence
                        && LOSSES.contains(&why.as_str()))
        });
        if !lost {
            continue;
        }
        let Some(until) = expiry_granted(run, &b.key, b.fence, |at| at < b.to) else {
            continue;
        };
        let since = granted_at(&run.grants, &b.key, b.fence).unwrap_or(b.from);
        if run.breaks.any(&b.key, since, b.to.max(until)) {
            continue;
        }
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        margins.push(ms(until) - ms(b.to));
    }
    margins
}
