//! A kept minimum put right spends little (`release/late.rs`, `Kept`):
//! while a late request of its lease may land, the expiry is put back to
//! the minimum's end every 3 s, and once more when the last window has
//! closed; then nothing more. A renewal back that failed is tried again
//! after a pause of a second or two, never at once; one refused for good
//! never; each gives up within 3 s. `check/minimum.rs`
//! judges where the lease ends; a fix-up that renews in a loop ends it in
//! the right place and spends the project's quota: this catches it.
//! Judged on exact clocks (the fix-up is timed on the host's).

use std::time::Duration;

use volcano_mock_server::Operation;

use super::minimum::Asked;
use super::run::Run;
use crate::log::Event;
use crate::net::{Attempt, LATE_MARGIN};

/// The least pause between a renewal back and the next (its retry pause
/// is 1 s, its cadence 3 s), less a tick.
const LEAST_PAUSE: Duration = Duration::from_millis(900);
/// Timers fire on ticks.
const SLACK: Duration = Duration::from_millis(20);
/// A renewal back's timeout: short, so that one left unanswered extends
/// the windows only a little.
const BACK_TIMEOUT: Duration = Duration::from_secs(3);

/// When a request's outcome was known to its client: its answer, or its
/// failure.
fn ended(a: &Attempt) -> Option<Duration> {
    a.answer.as_ref().map(|o| o.at).or(a.failed)
}

/// Each kept minimum judged (on a host whose lease clock did not move
/// meanwhile), the requests of its token, and when the keep returned (the
/// fix-up's requests are those sent since).
fn fix_ups<'a>(run: &Run<'a>) -> Vec<(Asked<'a>, Vec<&'a Attempt>, Duration)> {
    let mut found = Vec::new();
    for m in super::minimum::kept(run) {
        if run.lease_clock_moved(m.client, m.returned, m.asked_until) {
            continue;
        }
        let Some(token) = run.token_of(m.key, m.fence) else {
            continue;
        };
        let of_token: Vec<&Attempt> = run
            .server
            .sent
            .attempts
            .iter()
            .filter(|a| a.client == m.client && a.token.as_deref() == Some(token))
            .collect();
        // The keep (retried as any renewal is) returned then.
        let kept_at = run.events.iter().find_map(|e| match &e.event {
            Event::MinimumEnded {
                client,
                key,
                fence,
                kept: true,
            } if *client == m.client && key == m.key && *fence == m.fence => Some(e.at),
            _ => None,
        });
        if let Some(kept_at) = kept_at {
            found.push((m, of_token, kept_at));
        }
    }
    found
}

/// When the window of every request of a token that may land late, sent
/// before `at`, closes, counted as late as the SDK may count it: from its
/// 5xx, its failure, or the keep (`returned`: a request abandoned then),
/// its whole timeout and the margin.
fn windows_close(of_token: &[&Attempt], returned: Duration, at: Duration) -> Duration {
    of_token
        .iter()
        .filter(|a| a.sent < at && may_land_late(a))
        .map(|a| {
            let from = a.answer.as_ref().map(|o| o.at).or(a.failed);
            // An acquire's tries are counted with the request timeout
            // asked for, not each try's own, cut short by a wait's
            // deadline (kept-minimums seed 481).
            let timeout = match a.operation {
                Operation::Acquire => a.timeout.max(crate::program::TIMEOUT),
                _ => a.timeout,
            };
            from.unwrap_or(returned).max(a.sent) + timeout + LATE_MARGIN
        })
        .max()
        .unwrap_or_default()
}

/// Answered 5xx or not at all: it may land later.
fn may_land_late(a: &Attempt) -> bool {
    a.answer.as_ref().is_none_or(|o| o.status >= 500)
}

/// After the keep, renewals back go no sooner than [`LEAST_PAUSE`] after
/// the last request of the lease ended, but for one (the one once the
/// last window closed); none after the minimum's end; and none after a
/// renewal back sent once every window had closed was answered.
pub(super) fn fix_up_spends_little(run: &Run<'_>, out: &mut Vec<String>) {
    if run.clock_rate != 1.0 {
        return;
    }
    for (m, of_token, kept_at) in fix_ups(run) {
        let windows_close = |at: Duration| windows_close(&of_token, m.returned, at);
        let renewals: Vec<&&Attempt> = of_token
            .iter()
            .filter(|a| a.operation == Operation::Renew && a.sent > kept_at)
            .collect();
        let mut last_end = None;
        let mut closed_and_kept = false;
        let mut short_gaps = 0;
        let mut refused = None;
        for r in renewals {
            let fault = |what: String| {
                format!(
                    "kept minimum fix-up wasteful: client {}'s minimum on {} (fence {}, until \
                     {:?}) {what}",
                    m.client, m.key, m.fence, m.asked_until
                )
            };
            if let Some(status) = refused {
                out.push(fault(format!(
                    "renewed back at {:?} after a renewal back was refused with {status}",
                    r.sent
                )));
                break;
            }
            if r.timeout > BACK_TIMEOUT {
                out.push(fault(format!(
                    "renewed back at {:?} with a timeout of {:?} (more than {BACK_TIMEOUT:?})",
                    r.sent, r.timeout
                )));
                break;
            }
            if closed_and_kept {
                out.push(fault(format!(
                    "was put right once every window had closed, then renewed again at {:?}",
                    r.sent
                )));
                break;
            }
            if r.sent > m.asked_until + SLACK {
                out.push(fault(format!("renewed at {:?}, past its end", r.sent)));
                break;
            }
            let close = windows_close(r.sent);
            let once_closed = r.sent + SLACK >= close;
            if let Some(prev) = last_end {
                // One renewal back may follow closely: the one once the
                // last window closed (the SDK's window may close sooner
                // than counted here).
                let short = r.sent + SLACK < prev + LEAST_PAUSE;
                short_gaps += usize::from(short);
                if short && short_gaps > 1 {
                    out.push(fault(format!(
                        "renewed back at {:?}, {:?} after its last request ended",
                        r.sent,
                        r.sent.saturating_sub(prev)
                    )));
                    break;
                }
            }
            // Any request of the lease (a release too) ends the pause.
            last_end = of_token
                .iter()
                .filter(|a| a.sent <= r.sent + SLACK)
                .filter_map(|a| ended(a))
                .max()
                .max(ended(r));
            closed_and_kept = once_closed && r.answer.as_ref().is_some_and(|o| o.status == 200);
            // Refused for good (a revoked key, a lease gone): no renewal
            // back mends it.
            refused = r
                .answer
                .as_ref()
                .map(|o| o.status)
                .filter(|s| matches!(s, 400 | 401 | 403 | 404 | 409));
        }
    }
}

/// A kept minimum's fix-up releases only what a late acquire may take
/// again (`Kept::put_right`): after a renewal back found the lease gone
/// (409), a release before the minimum's end or after it only if a try
/// of its acquire (answered 5xx or not at all) was sent and some
/// request's window was still open; and a second
/// release (another request, not a retry) only if a late acquire (or a lease a late
/// acquire took under the token, found by a renewal back) could land
/// after that first release went.
pub(super) fn fix_up_releases_only_what_may_land(run: &Run<'_>, out: &mut Vec<String>) {
    if run.clock_rate != 1.0 {
        return;
    }
    for (m, of_token, kept_at) in fix_ups(run) {
        let since = |op: Operation| {
            of_token
                .iter()
                .filter(move |a| a.operation == op && a.sent > kept_at)
        };
        let acquire_late = of_token
            .iter()
            .any(|a| a.operation == Operation::Acquire && may_land_late(a));
        let stranger = since(Operation::Renew).any(|a| {
            a.answer
                .as_ref()
                .is_some_and(|o| o.status == 200 && o.fence != Some(m.fence))
        });
        let open_at = |at: Duration| at < windows_close(&of_token, m.returned, at) + SLACK;
        let fault = |what: String| {
            format!(
                "kept minimum fix-up released what nothing may take again: client {}'s minimum \
                 on {} (fence {}, until {:?}) {what}",
                m.client, m.key, m.fence, m.asked_until
            )
        };
        let gone = since(Operation::Renew)
            .find_map(|a| a.answer.as_ref().filter(|o| o.status == 409).map(|o| o.at));
        // Each release's first attempt (a retry has its request id).
        let mut releases: Vec<&&Attempt> = since(Operation::Release).collect();
        let mut ids = std::collections::BTreeSet::new();
        releases.retain(|r| ids.insert(r.request_id.as_str()));
        // (The release at the minimum's end goes whatever a renewal back
        // found: kept-minimums seed 98.)
        let after_gone = gone.and_then(|gone| {
            let release = releases
                .iter()
                .find(|r| r.sent >= gone && r.sent.abs_diff(m.asked_until) > SLACK)?;
            Some((gone, release))
        });
        if let Some((gone, release)) = after_gone {
            let may_land = stranger || (acquire_late && open_at(gone));
            if !may_land {
                out.push(fault(format!(
                    "released at {:?} after a renewal back found it gone at {gone:?}, with no \
                     late acquire to land",
                    release.sent
                )));
                continue;
            }
        }
        let Some(first) = releases.first() else {
            continue;
        };
        // Another request id: one more release, not a retry of the first.
        let again = releases.iter().find(|r| r.request_id != first.request_id);
        if let Some(again) = again {
            if !((acquire_late || stranger) && open_at(first.sent)) {
                out.push(fault(format!(
                    "released again at {:?}, after a release sent at {:?} once no late acquire \
                     could land",
                    again.sent, first.sent
                )));
            }
        }
    }
}
