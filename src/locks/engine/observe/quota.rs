//! The client's record of its project's spent quota ([`Quota`]), which
//! its waiters and observers wait out.

use tokio::time::Instant;

use crate::error::Error;
use crate::retry::observe::MAX_PAUSE;

/// Until when the project's quota is spent, as a 429 to any of a client's
/// requests said (a waiter's try or look, an observer's look, a renewal,
/// a release): its waiters and observers wait for it too, instead of each
/// spending a request to learn it. Renewals still go: a lost lock costs
/// more than a try.
#[derive(Debug, Default)]
pub(crate) struct Quota(std::sync::Mutex<Option<Instant>>);

impl Quota {
    /// A 429 came at `received`: the quota is spent until the window it
    /// names (at most a minute, the longest a window lasts).
    pub(crate) fn refused(&self, err: &Error, received: Instant) {
        if let (Error::RateLimited(_), Some(after)) = (err, err.retry_after()) {
            self.spent_until(received + after.min(MAX_PAUSE));
        }
    }

    fn spent_until(&self, until: Instant) {
        let mut quiet = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *quiet = Some(quiet.map_or(until, |q| q.max(until)));
    }

    pub(crate) fn quiet_until(&self) -> Option<Instant> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[tokio::test(start_paused = true)]
    async fn a_clients_quota_is_spent_until_the_latest_window_named() {
        let quota = Quota::default();
        assert_eq!(quota.quiet_until(), None);
        let now = Instant::now();
        quota.spent_until(now + S(7));
        quota.spent_until(now + S(3));
        assert_eq!(quota.quiet_until(), Some(now + S(7)));
        quota.spent_until(now + S(9));
        assert_eq!(quota.quiet_until(), Some(now + S(9)));
    }
}
