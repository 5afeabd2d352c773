//! The early warning: a held lease's renewals are failing (the service
//! unavailable, the quota spent, the network down) but the lease is still
//! ours by its local deadline. An episode begins at the first renewal
//! attempt that fails transiently and ends when a renewal succeeds or the
//! lock ends; a refusal is a loss at once, never a risk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::error::Error;

/// A lease's risk: the last transient failure while an episode lasts.
pub(crate) struct Risk {
    cause: Mutex<Option<Arc<Error>>>,
    /// Tells waiters of a change (an episode begins or ends).
    changed: watch::Sender<()>,
    /// Episodes begun.
    episodes: AtomicU64,
}

impl Risk {
    pub(crate) fn new() -> Self {
        Risk {
            cause: Mutex::new(None),
            changed: watch::Sender::new(()),
            episodes: AtomicU64::new(0),
        }
    }

    /// A renewal attempt failed transiently with `err`, `remaining` before
    /// the local deadline: an episode begins (said once, counted), or the
    /// one under way gets its latest cause.
    pub(crate) fn failing(&self, key: &str, err: Arc<Error>, remaining: Duration) {
        if sabotaged!(NoRiskWarning) {
            return;
        }
        let began = {
            let mut cause = crate::lock_unpoisoned(&self.cause);
            let began = cause.is_none();
            *cause = Some(err.clone());
            began
        };
        if began {
            self.episodes.fetch_add(1, Ordering::Relaxed);
            crate::telemetry::at_risk();
            tracing::warn!(
                key,
                error = %crate::error::chain(&*err),
                remaining_ms = remaining.as_millis() as u64,
                "lock at risk: renewals are failing; still ours until its local deadline"
            );
            self.changed.send_replace(());
        }
    }

    /// The episode, if one is under way, ends: a renewal succeeded
    /// (`renewed`), or the lock ended.
    pub(crate) fn clear(&self, key: &str, renewed: bool) {
        if renewed && sabotaged!(RiskNeverClears) {
            return;
        }
        let ended = crate::lock_unpoisoned(&self.cause).take().is_some();
        if ended {
            if renewed {
                tracing::info!(key, "lock no longer at risk: a renewal succeeded");
            }
            self.changed.send_replace(());
        }
    }

    /// The last transient failure, while an episode lasts.
    pub(crate) fn cause(&self) -> Option<Arc<Error>> {
        crate::lock_unpoisoned(&self.cause).clone()
    }

    /// How many episodes have begun.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) fn episodes(&self) -> u64 {
        self.episodes.load(Ordering::Relaxed)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> Arc<Error> {
        Arc::new(Error::from_status(crate::ApiError {
            status: Some(503),
            code: None,
            message: String::new(),
            request_id: None,
            retry_after: None,
            after_uncertain: false,
            first_may_land_late: false,
            from_service: false,
        }))
    }

    #[test]
    fn an_episode_begins_once_and_ends_at_a_renewal_or_the_end() {
        let risk = Risk::new();
        let mut changed = risk.subscribe();
        assert!(risk.cause().is_none());
        risk.failing("k", unavailable(), Duration::from_secs(20));
        risk.failing("k", unavailable(), Duration::from_secs(18));
        assert!(risk.cause().is_some());
        assert_eq!(risk.episodes(), 1, "one episode, two failures");
        assert!(changed.has_changed().unwrap());
        changed.mark_unchanged();
        risk.clear("k", true);
        assert!(risk.cause().is_none());
        assert!(changed.has_changed().unwrap(), "its end is told");
        changed.mark_unchanged();
        risk.clear("k", false);
        assert!(!changed.has_changed().unwrap(), "nothing to end");
        risk.failing("k", unavailable(), Duration::from_secs(20));
        risk.clear("k", false);
        assert!(risk.cause().is_none());
        assert_eq!(risk.episodes(), 2);
    }
}
