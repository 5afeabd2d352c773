//! The early warning (`LockGuard::at_risk`) follows the renewals, as the
//! clients sent and heard them: a held guard whose latest renewal failed
//! transiently (no answer, a 429, a 5xx) says it is at risk, and one
//! whose latest renewal succeeded says it is not. A warning that never
//! clears is as useless as one that never rises: a caller who stops
//! taking on work while at risk would stop for good.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::Event;
use crate::net::Attempt;

/// How long a guard may take to take in an answer: a tick or two.
const TAKEN_IN: Duration = Duration::from_millis(60);

/// When its client learned how `attempt` ended, and whether it failed
/// transiently (`None`: a refusal, which ends the lock rather than
/// putting it at risk; or no end seen).
fn resolved(attempt: &Attempt) -> Option<(Duration, bool)> {
    match (&attempt.answer, attempt.failed) {
        (Some(a), _) if a.status == 200 => Some((a.at, false)),
        (Some(a), _) if a.status == 429 || a.status >= 500 => Some((a.at, true)),
        (Some(_), _) => None,
        (None, Some(failed)) => Some((failed, true)),
        (None, None) => None,
    }
}

/// At every write under a guard that was not lost then: at risk exactly
/// when the latest renewal attempt of its lease its client had heard the
/// end of (a tick before) had failed transiently. Not judged in the tick
/// after an attempt ended, nor after a refusal.
pub(super) fn follows_renewals(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    for e in run.events {
        let Event::Wrote {
            client,
            key,
            fence,
            at_risk: Some(at_risk),
            ..
        } = &e.event
        else {
            continue;
        };
        // The latest grant of this fence: a caller's token acquired again
        // gets the same fence, and a new guard with no risk of its own.
        let granted = attempts.iter().rposition(|a| {
            a.sent <= e.at
                && a.client == *client
                && a.key == *key
                && a.operation == Operation::Acquire
                && a.answer
                    .as_ref()
                    .is_some_and(|o| o.status == 201 && o.fence == Some(*fence))
        });
        let Some(i) = granted else { continue };
        let Some(token) = attempts[i].token.as_deref() else {
            continue;
        };
        let ends = attempts[i + 1..]
            .iter()
            .filter(|a| a.operation == Operation::Renew && a.token.as_deref() == Some(token))
            .filter_map(|a| match (&a.answer, a.failed) {
                (Some(o), _) => Some((o.at, resolved(a))),
                (None, Some(failed)) => Some((failed, resolved(a))),
                (None, None) => None,
            })
            .filter(|(at, _)| *at <= e.at);
        let Some((last_at, how)) = ends.max_by_key(|(at, _)| *at) else {
            continue;
        };
        let Some((_, failing)) = how.filter(|_| last_at + TAKEN_IN <= e.at) else {
            continue;
        };
        if failing != *at_risk {
            let (said, latest) = if *at_risk {
                ("at risk", "succeeded")
            } else {
                ("not at risk", "failed transiently")
            };
            out.push(format!(
                "at_risk: client {client}'s guard on {key} (fence {fence}) said it was {said} at \
                 {:?}, after its latest renewal {latest} at {last_at:?}",
                e.at
            ));
        }
    }
}
