//! Tries failing without an answer about the lock: since when (a leader's
//! status follows it), and the log's warning when that lasts ([`Episode`]).

use std::time::Duration;

use tokio::time::Instant;

use super::Waiter;
use crate::error::Error;
use crate::retry::wait::WARN_UNANSWERED_AFTER;

/// What a wait's logs say of a failed try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Episode {
    /// Failing without an answer for [`WARN_UNANSWERED_AFTER`]: warn.
    Unanswered(Duration),
    /// Answered again after such a warning.
    Answered,
}

impl Waiter {
    /// Notes whether a failed try was answered by the service about the
    /// lock (`409`, or a `429` about the quota) or not (no answer, a 5xx):
    /// [`Waiter::failing_since`] (a leader's status) follows it.
    pub(crate) fn failed(&mut self, err: &Error) {
        // Any answer of the service's own but a 5xx.
        let answered = err.status().is_some_and(|status| status < 500);
        self.failing_since = if answered {
            None
        } else {
            Some(self.failing_since.unwrap_or_else(Instant::now))
        };
    }

    /// For the log only: says, after [`Waiter::failed`], when an episode
    /// of unanswered tries needs a warning, or ends after one.
    pub(crate) fn episode(&mut self) -> Option<Episode> {
        let Some(since) = self.failing_since else {
            return std::mem::take(&mut self.warned).then_some(Episode::Answered);
        };
        let failing = since.elapsed();
        if self.warned || failing < WARN_UNANSWERED_AFTER {
            return None;
        }
        self.warned = true;
        Some(Episode::Unanswered(failing))
    }

    /// Since when the tries have failed without an answer from the
    /// service, while they do.
    pub(crate) fn failing_since(&self) -> Option<Instant> {
        self.failing_since
    }
}
