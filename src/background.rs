//! The releases a client runs in the background (cancelled scopes, final
//! releases still being retried, undone acquires): a registry by key and
//! token, so that `Client::shutdown` can wait for them and an acquire with
//! the same token can stop them first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

/// The releases a client runs in the background.
#[derive(Default)]
pub(crate) struct Background {
    next: AtomicU64,
    running: Mutex<HashMap<u64, Running>>,
    /// How many are running; `shutdown` waits for zero.
    count: watch::Sender<usize>,
}

/// One background release, as the registry sees it.
struct Running {
    key: String,
    /// Held only to match a later acquire with the same token; never logged.
    token: String,
    superseded: watch::Sender<bool>,
    finished: watch::Receiver<bool>,
}

impl Background {
    pub(crate) fn register(
        self: &Arc<Self>,
        key: &str,
        token: &str,
    ) -> (Pending, watch::Receiver<bool>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (superseded, superseded_rx) = watch::channel(false);
        let (finished, finished_rx) = watch::channel(false);
        self.lock().insert(
            id,
            Running {
                key: key.to_owned(),
                token: token.to_owned(),
                superseded,
                finished: finished_rx,
            },
        );
        self.count.send_modify(|n| *n += 1);
        let pending = Pending {
            background: self.clone(),
            id,
            finished,
        };
        (pending, superseded_rx)
    }

    pub(crate) fn supersede(&self, key: &str, token: &str) -> Vec<watch::Receiver<bool>> {
        let running = self.lock();
        running
            .values()
            .filter(|r| r.key == key && r.token.eq_ignore_ascii_case(token))
            .map(|r| {
                r.superseded.send_replace(true);
                r.finished.clone()
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) async fn wait_idle(&self, timeout: Duration) -> Vec<String> {
        let mut count = self.count.subscribe();
        let _ = tokio::time::timeout(timeout, count.wait_for(|n| *n == 0)).await;
        let mut keys: Vec<String> = self.lock().values().map(|r| r.key.clone()).collect();
        keys.sort();
        keys
    }
}

/// One background release; finished (or dropped with its runtime) when
/// this is dropped.
pub(crate) struct Pending {
    background: Arc<Background>,
    id: u64,
    finished: watch::Sender<bool>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.background.lock().remove(&self.id);
        self.finished.send_replace(true);
        self.background.count.send_modify(|n| *n -= 1);
    }
}
