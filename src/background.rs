//! The releases a client runs in the background (cancelled scopes, final
//! releases still being retried, undone acquires): a registry by key and
//! token, so that `Client::shutdown` can wait for them and an acquire with
//! the same token can stop them first. A release that ended without
//! freeing its lease (refused, given up, or dropped with its runtime) is
//! remembered for as long as that lease may be live, so that `shutdown`
//! reports it instead of saying all is well.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::BoxFuture;

/// The releases a client runs in the background.
#[derive(Default)]
pub(crate) struct Background {
    next: AtomicU64,
    running: Mutex<BTreeMap<u64, Running>>,
    /// How many are running; `shutdown` waits for zero.
    count: watch::Sender<usize>,
    /// Background releases that ended without freeing the lease: key,
    /// token (never logged), and the time after which that lease can no
    /// longer be live.
    unreleased: Mutex<Vec<Unreleased>>,
    /// Acquisitions with a generated token that succeeded after a try whose
    /// outcome is unknown: that try may still land until `land_by`, so a
    /// release of the lease before then is followed by another after it.
    late: Mutex<Vec<Late>>,
}

/// A window in which a late try of a granted acquisition may still land.
struct Late {
    key: String,
    /// Never logged.
    token: String,
    land_by: Instant,
    ttl: Duration,
}

struct Unreleased {
    key: String,
    token: String,
    live_until: Instant,
}

/// How a background release ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The lease is not held by this token any more: released, never
    /// granted, or another token's now.
    Freed,
    /// The lease may still be live (the release was refused or gave up).
    MayBeHeld,
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
    /// Registers a release of `key`/`token`, whose lease may be live for
    /// `live_for` more.
    pub(crate) fn register(
        self: &Arc<Self>,
        key: &str,
        token: &str,
        live_for: Duration,
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
            key: key.to_owned(),
            token: token.to_owned(),
            live_until: Instant::now().checked_add(live_for),
            settled: None,
            finished,
        };
        (pending, superseded_rx)
    }

    /// Stops the releases of `key`/`token` (an acquire with that token is
    /// about to recover the lease). Returns their finish signals. A
    /// stopped release counts its lease as possibly held until that
    /// acquire's answer says otherwise ([`Background::forget`]).
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

    /// The finish signals of the releases of `key`/`token` running now,
    /// without stopping them.
    pub(crate) fn running(&self, key: &str, token: &str) -> Vec<watch::Receiver<bool>> {
        self.lock()
            .values()
            .filter(|r| r.key == key && r.token.eq_ignore_ascii_case(token))
            .map(|r| r.finished.clone())
            .collect()
    }

    /// An acquire with `token` was answered (`201`: the lease is its own
    /// again; `409`: another token holds the key): a release of this
    /// token that failed no longer leaves a lease behind.
    pub(crate) fn forget(&self, key: &str, token: &str) {
        self.lock_unreleased()
            .retain(|u| !(u.key == key && u.token.eq_ignore_ascii_case(token)));
    }

    /// Remembers that a try of the acquisition that granted `key`/`token`
    /// (with `ttl`) may still be applied until `land_by`.
    pub(crate) fn late_window(&self, key: &str, token: &str, land_by: Instant, ttl: Duration) {
        let now = Instant::now();
        let mut late = crate::lock_unpoisoned(&self.late);
        late.retain(|l| l.land_by > now);
        late.push(Late {
            key: key.to_owned(),
            token: token.to_owned(),
            land_by,
            ttl,
        });
    }

    /// The open window of `key`/`token`, if any, taken: when its late try
    /// can no longer land, and the ttl that try asked for.
    pub(crate) fn take_late_window(&self, key: &str, token: &str) -> Option<(Instant, Duration)> {
        let now = Instant::now();
        let mut late = crate::lock_unpoisoned(&self.late);
        late.retain(|l| l.land_by > now);
        let at = late
            .iter()
            .position(|l| l.key == key && l.token.eq_ignore_ascii_case(token))?;
        let taken = late.swap_remove(at);
        Some((taken.land_by, taken.ttl))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Running>> {
        crate::lock_unpoisoned(&self.running)
    }

    fn lock_unreleased(&self) -> std::sync::MutexGuard<'_, Vec<Unreleased>> {
        crate::lock_unpoisoned(&self.unreleased)
    }

    /// Remembers that the lease of `key`/`token` may stay live until
    /// `live_until` (`None`: too far ahead to represent; a day, then).
    pub(crate) fn unreleased(&self, key: &str, token: &str, live_until: Option<Instant>) {
        let now = Instant::now();
        let live_until = live_until.unwrap_or(now + Duration::from_secs(86_400));
        let mut unreleased = self.lock_unreleased();
        unreleased.retain(|u| u.live_until > now);
        unreleased.push(Unreleased {
            key: key.to_owned(),
            token: token.to_owned(),
            live_until,
        });
    }

    /// Waits up to `timeout` for every running release, then names the
    /// keys that may still be held: releases still running, and releases
    /// that ended without freeing a lease that may still be live.
    pub(crate) async fn wait_idle(&self, timeout: Duration) -> Vec<String> {
        let mut count = self.count.subscribe();
        let _ = tokio::time::timeout(timeout, count.wait_for(|n| *n == 0)).await;
        let mut keys: Vec<String> = self.lock().values().map(|r| r.key.clone()).collect();
        let now = Instant::now();
        keys.extend(
            self.lock_unreleased()
                .iter()
                .filter(|u| u.live_until > now)
                .map(|u| u.key.clone()),
        );
        keys.sort();
        keys.dedup();
        keys
    }
}

/// One background release, finished when this is dropped. Dropped without
/// [`Pending::settle`] (its task dropped with a runtime shutting down), it
/// says so and counts the lease as possibly held.
pub(crate) struct Pending {
    background: Arc<Background>,
    id: u64,
    key: String,
    token: String,
    live_until: Option<Instant>,
    settled: Option<Settled>,
    finished: watch::Sender<bool>,
}

impl Pending {
    /// Records how the release ended.
    pub(crate) fn settle(mut self, settled: Settled) {
        self.settled = Some(settled);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        match self.settled {
            Some(Settled::Freed) => {}
            Some(Settled::MayBeHeld) => {
                self.background
                    .unreleased(&self.key, &self.token, self.live_until)
            }
            None => {
                tracing::warn!(
                    key = %self.key,
                    "background release dropped before it finished (its runtime is shutting \
                     down?); the lease expires at its ttl"
                );
                self.background
                    .unreleased(&self.key, &self.token, self.live_until);
            }
        }
        self.background.lock().remove(&self.id);
        self.finished.send_replace(true);
        self.background.count.send_modify(|n| *n -= 1);
    }
}

/// The release plumbing lock calls use.
impl Background {
    /// Runs the release of `key`/`token` in the background (on the current
    /// tokio runtime), so that [`Client::shutdown`](crate::Client::shutdown) can wait for it; its
    /// lease may be live for `live_for` more. The release gets a receiver
    /// that turns `true` when an acquire with the same token supersedes it,
    /// and says how it ended. Without a runtime nothing runs: the warning
    /// says which key stays held until its ttl, and `shutdown` reports it.
    pub(crate) fn spawn_release<F>(
        self: &Arc<Self>,
        key: &str,
        token: &str,
        live_for: Duration,
        release: F,
    ) where
        F: FnOnce(watch::Receiver<bool>) -> BoxFuture<Settled>,
    {
        let background = self;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key, "no tokio runtime: lease left to expire");
            background.unreleased(
                key,
                token,
                tokio::time::Instant::now().checked_add(live_for),
            );
            return;
        };
        let (pending, superseded) = background.register(key, token, live_for);
        let release = release(superseded);
        // In the caller's span (a hold's, say): its fields stay on the logs.
        // A runtime shutting down drops the task unrun: `pending` then
        // reports that.
        runtime.spawn(tracing::Instrument::in_current_span(async move {
            let settled = release.await;
            pending.settle(settled);
        }));
    }

    /// Before an acquire with a token the caller names: stops background
    /// releases of the same key and token from sending more attempts, and
    /// waits for an attempt in flight to finish, so that no stale release
    /// can free the lease this acquire recovers.
    pub(crate) async fn supersede_releases(&self, key: &str, token: &str) {
        for mut finished in self.supersede(key, token) {
            let _ = finished.wait_for(|done| *done).await;
        }
    }

    /// Waits, up to `timeout`, for the background releases of `key` under
    /// any of `tokens` that are running now (a leader stepping down waits
    /// for its campaigns'); false if some had not finished by then.
    pub(crate) async fn await_releases(
        &self,
        key: &str,
        tokens: &[String],
        timeout: Duration,
    ) -> bool {
        let running: Vec<_> = tokens
            .iter()
            .flat_map(|token| self.running(key, token))
            .collect();
        tokio::time::timeout(timeout, async {
            for mut finished in running {
                let _ = finished.wait_for(|done| *done).await;
            }
        })
        .await
        .is_ok()
    }
}
