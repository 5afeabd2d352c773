//! The builder of `leader`: it collects the options and the `until`
//! signal, and `run` hands them to the engine ([`engine::leader`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::Error;
use crate::locks::engine::{self, leader::Signal};
use crate::locks::{AcquireOptions, LockGuard, Locks};

/// `locks.leader(key, ttl)`; see [`Locks::leader`].
#[must_use = "leader election starts only when run(..) is awaited"]
pub struct Leader {
    pub(crate) locks: Locks,
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    /// How every campaign acquires and holds the lock (it waits without a
    /// deadline, with a token generated per campaign).
    pub(crate) options: AcquireOptions,
    /// Behind a mutex only so that a `Leader` is `Sync` (a boxed future is
    /// `Send` alone): `status()` and `health()` take `&self`.
    pub(crate) until: std::sync::Mutex<Option<Signal>>,
    /// How long a term may take to return once `until` fired.
    pub(crate) drain: Duration,
    /// What [`Leader::status`] watches.
    pub(crate) status: watch::Sender<LeaderStatus>,
    /// Label the leader's metrics with its key.
    pub(crate) key_in_metrics: bool,
    /// The running term, for [`Leader::health`].
    pub(crate) term: Arc<engine::leader::TermSlot>,
}

/// A leader's health, for a liveness probe: whether a term has outlived
/// its lock without stepping down. From [`Leader::health`]; clones see the
/// same leader. No request to the service.
///
/// A term is dropped at its next `.await` once its lock is lost. A term
/// that keeps its thread instead (blocking code, a loop that never
/// awaits) runs on while another holder may have been elected; its status
/// still says `Leading`, because the candidate cannot run to change it.
/// [`LeaderHealth::overdue`] sees it from outside: restart such a process.
/// It sees the term itself, not work the term spawned (a spawned task
/// outlives the term unseen). Right after the machine slept past the
/// lease, one probe may read the sleep before the candidate has run to
/// drop the term: confirm on a second probe.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) {
/// use std::time::Duration;
/// let leader = locks.leader("scheduler", Duration::from_secs(15));
/// let health = leader.health();
/// tokio::spawn(leader.run(|term| async move {
///     term.lost().await;
///     Ok::<(), volcano::Error>(())
/// }));
/// // In the liveness probe:
/// let healthy = health.overdue().is_none_or(|late| late < Duration::from_secs(5));
/// # let _ = healthy; }
/// ```
#[derive(Clone)]
pub struct LeaderHealth {
    term: Arc<engine::leader::TermSlot>,
}

impl LeaderHealth {
    /// How long the running term has outlived its lock without stepping
    /// down: since its local deadline passed (or, for a loss before it,
    /// since a call here first saw the loss). `None` while no term runs or
    /// its lock is held. Right at a loss it is `Some` for the moment the
    /// candidate takes to drop the term; compare it with a tolerance.
    pub fn overdue(&self) -> Option<Duration> {
        self.term.overdue()
    }
}

impl std::fmt::Debug for LeaderHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderHealth")
            .field("overdue", &self.overdue())
            .finish()
    }
}

/// Where a [`Leader`] stands, for a readiness probe: read from a watch
/// channel ([`Leader::status`]) without any request to the service.
///
/// A readiness probe asks "am I a healthy candidate?", not "do I lead?":
/// a rolling update waits for new replicas to become ready, and they start
/// as followers ([the leader
/// guide](crate::guide::leader#what-a-probe-should-ask)).
/// Traffic for the leader alone goes by `Leading`, on another endpoint.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) {
/// use std::time::Duration;
/// use volcano::LeaderStatus;
/// let leader = locks.leader("scheduler", Duration::from_secs(15));
/// let status = leader.status();
/// tokio::spawn(leader.run(|term| async move {
///     term.lost().await;
///     Ok::<(), volcano::Error>(())
/// }));
/// let ready = match *status.borrow() {
///     LeaderStatus::Leading { .. } | LeaderStatus::SteppingDown { .. } => true,
///     LeaderStatus::Following => true,
///     LeaderStatus::Unreachable { since } => since.elapsed() < Duration::from_secs(30),
///     _ => false, // Stopped, or a status added later
/// };
/// # let _ = ready; }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderStatus {
    /// This candidate leads: its term runs under the lease with this
    /// fencing token. `at_risk`: the term's renewals are failing while the
    /// lease is still ours ([`LockGuard::at_risk`]). It turns to another
    /// status as soon as the term's lock is lost, before the next campaign.
    Leading {
        /// The term's fencing token.
        fencing_token: i64,
        /// The term's renewals are failing.
        at_risk: bool,
    },
    /// This candidate still leads but steps down: `until` fired and its
    /// term drains ([`Leader::drain`]). The lock is held and renewed under
    /// this fencing token until the term returns or the drain runs out.
    /// Still a ready candidate, but no longer the place for leader-only
    /// work (route that by `Leading` alone).
    SteppingDown {
        /// The term's fencing token.
        fencing_token: i64,
    },
    /// Campaigning (or not started yet): another candidate leads, or the
    /// key is about to be taken.
    Following,
    /// Campaigning, and the service has not answered the campaign's tries
    /// (no answer, a 5xx) since `since`.
    Unreachable {
        /// When the tries began to fail without an answer.
        since: std::time::Instant,
    },
    /// `run` has returned: this candidate neither leads nor campaigns.
    Stopped,
}

impl std::fmt::Debug for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leader")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("options", &self.options)
            .field(
                "until",
                &crate::lock_unpoisoned(&self.until).as_ref().map(|_| "..."),
            )
            .field("status", &*self.status.borrow())
            .finish()
    }
}

option_setters!(impl[] Leader => [options] {
    poll_interval,
    max_hold,
});

impl Leader {
    /// Step down (drop the running term, release, return `Ok(())`) once
    /// `signal` completes, for example on SIGTERM. `run` returns within
    /// 1 s of it when not leading (a campaign's try in flight is undone in
    /// the background), and within the [drain](Self::drain) plus 2 s when
    /// leading on a healthy service; a release or undo not settled by then
    /// goes on, and [`Client::shutdown`](crate::Client::shutdown) waits for
    /// it and names its key.
    pub fn until(mut self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        self.until = std::sync::Mutex::new(Some(Box::pin(signal)));
        self
    }

    /// Once `until` fires, lets the running term finish its work for up to
    /// `drain` before the candidate steps down, instead of dropping it at
    /// once. Meanwhile its lock stays held and renewed, the term's guard
    /// says so ([`LockGuard::stepping_down`] resolves,
    /// [`LockGuard::is_stepping_down`] is true) and the status is
    /// [`LeaderStatus::SteppingDown`]. The lock is released only after the
    /// term returned, or was dropped when the drain ran out (logged at
    /// WARN), so the next leader cannot begin while this one still works.
    ///
    /// - A loss during the drain drops the term at once, as always: the
    ///   lock is gone. `run` then returns `Error::LockLost` (the work in
    ///   hand may not have finished) without campaigning again.
    /// - `run` returns the term's own result when it returned within the
    ///   drain; `Ok(())` when it was dropped at the end of the drain.
    /// - A term that never awaits cannot be dropped: see
    ///   [`Leader::health`].
    /// - Zero (the default): the term is dropped as soon as `until` fires.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks, sigterm: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// locks
    ///     .leader("scheduler", Duration::from_secs(15))
    ///     .until(sigterm)
    ///     .drain(Duration::from_secs(20))
    ///     .run(|term| async move {
    ///         while !term.is_stepping_down() {
    ///             // ... one job, never cut in the middle by a SIGTERM ...
    ///             # tokio::time::sleep(Duration::from_secs(1)).await;
    ///         }
    ///         Ok::<(), volcano::Error>(())
    ///     })
    ///     .await
    /// # }
    /// ```
    pub fn drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// Where this candidate stands, as a watch channel that `run` keeps
    /// up to date: [`LeaderStatus::Following`] until it is elected,
    /// `Leading` while a term runs, `SteppingDown` while it drains,
    /// `Unreachable` while campaigning
    /// without answers from the service, `Stopped` once `run` returned.
    /// Take it before calling `run`; clones see the same values.
    pub fn status(&self) -> watch::Receiver<LeaderStatus> {
        self.status.subscribe()
    }

    /// Whether a term has outlived its lock without stepping down, for a
    /// liveness probe; see [`LeaderHealth`]. Take it before calling `run`.
    pub fn health(&self) -> LeaderHealth {
        LeaderHealth {
            term: Arc::clone(&self.term),
        }
    }

    /// Labels the leader's metrics (`volcano_leader_*`) with its key. Off
    /// by default, so that the metrics' cardinality stays bounded
    /// whatever keys an application elects on.
    pub fn key_in_metrics(mut self) -> Self {
        self.key_in_metrics = true;
        self
    }

    /// Campaigns and leads until the term ends leadership or `until`
    /// fires; see [`Locks::leader`].
    pub fn run<'f, F, Fut, E>(
        self,
        term: F,
    ) -> Pin<Box<dyn Future<Output = std::result::Result<(), E>> + Send + 'f>>
    where
        F: FnMut(LockGuard) -> Fut + Send + 'f,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'f,
        E: From<Error> + Send + 'f,
    {
        let Leader {
            locks,
            key,
            ttl,
            options,
            until,
            drain,
            status,
            key_in_metrics,
            term: slot,
        } = self;
        let report = engine::leader::Report::new(status, key_in_metrics.then(|| key.clone()), slot);
        let until = until
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let ending = engine::leader::Ending { until, drain };
        Box::pin(engine::leader::elect(
            locks, key, ttl, options, ending, report, term,
        ))
    }
}
