//! What every operation of a program shares ([`Ctx`]): the SDK's locks,
//! the log and the fenced store, and what it does with a guard it holds.
//! Every belief that it holds a key is logged with the guard's fence, and
//! ended when the guard says it is lost or released; the work under a
//! guard writes through the store, checking on the way that the guard
//! keeps its own contract.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use volcano::{Error, LeaderHealth, LeaderStatus, LeaseClock, LockGuard, Locks, LostReason};

use crate::log::{Event, Log};

/// The store the programs write to: keys behind a fence gate (the
/// in-memory store side of fencing), shared by every program of a run.
#[derive(Clone, Default)]
pub(crate) struct Gate(volcano_fence::Gate);

impl Gate {
    /// Whether the store accepts a write to `key` under `fence`.
    fn write(&self, key: &str, fence: i64) -> bool {
        self.0.check(key, fence).is_ok()
    }
}

/// How long the work pauses between writes.
pub(super) const PAUSE: Duration = Duration::from_millis(700);

/// What an operation needs.
pub(super) struct Ctx {
    pub(super) id: usize,
    pub(super) locks: Locks,
    pub(super) log: Log,
    gate: Gate,
    /// The client's lease clock: real time as the SDK counts it (a
    /// suspend moves it, not the runtime's clock).
    pub(super) clock: LeaseClock,
    /// The TTL the current operation asked for, in milliseconds.
    ttl_ms: AtomicU64,
    /// The server, for the faults a program plants on its own requests
    /// ([`Ctx::end_on_a_held_renewal`]).
    pub(super) server: Arc<Mutex<Option<volcano_mock_server::MockServer>>>,
    /// Counts the lock requests this client has sent.
    pub(super) requests: tokio::sync::watch::Receiver<u64>,
    /// [`Options::depth`](crate::Options::depth).
    pub(super) depth: crate::Depth,
}

impl Ctx {
    /// The context of program `id`'s operations.
    pub(super) fn new(
        id: usize,
        (locks, clock): (Locks, LeaseClock),
        log: Log,
        gate: Gate,
        server: Arc<Mutex<Option<volcano_mock_server::MockServer>>>,
        requests: tokio::sync::watch::Receiver<u64>,
    ) -> Ctx {
        Ctx {
            id,
            locks,
            log,
            gate,
            clock,
            ttl_ms: Default::default(),
            server,
            requests,
            depth: crate::Depth::Mix,
        }
    }

    /// Notes that the current operation asked for `ttl` (every guard it
    /// gets must say so).
    pub(super) fn asks_for(&self, ttl: Duration) {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.ttl_ms.store(ttl_ms, Ordering::Relaxed);
    }

    /// Logs an operation's outcome worth a line.
    pub(super) fn note(&self, what: impl Into<String>) {
        self.log.push(Event::Note {
            client: self.id,
            what: what.into(),
            try_again: None,
        });
    }

    /// Logs that the operation `what` failed with `err`. The programs
    /// pass only valid input: a refusal of it as invalid breaks the API's
    /// word.
    pub(super) fn failed(&self, what: &str, err: &Error) {
        if matches!(err, Error::InvalidArgument(_)) {
            self.broken(format!("{what}: valid input refused: {err}"));
        }
        self.log.push(Event::Note {
            client: self.id,
            what: format!("{what}: {err}"),
            try_again: Some(err.is_transient() || err.is_lock_held()),
        });
    }

    /// Logs that an API broke its own contract.
    pub(super) fn broken(&self, what: String) {
        self.log.push(Event::Contract {
            client: self.id,
            what,
        });
    }

    /// Logs how a release of `key` ended.
    pub(super) fn released(&self, key: &str, result: volcano::Result<()>) {
        match result {
            Ok(()) => self.log.push(Event::Released {
                client: self.id,
                key: key.to_owned(),
            }),
            Err(err) => self.note(format!("release of {key}: {err}")),
        }
    }

    /// A release this program sent by hand did not free `key` (the lease
    /// with `fence`, when known).
    pub(super) fn kept(&self, key: &str, fence: Option<i64>) {
        self.log.push(Event::Kept {
            client: self.id,
            key: key.to_owned(),
            fence,
        });
    }

    /// Logs that this program believes it holds the guard's key from now
    /// on, and ends that belief when the guard is lost or released. The
    /// returned future completes once the end is logged.
    pub(super) fn believe(&self, guard: &LockGuard) -> impl Future<Output = ()> + 'static {
        self.believe_term(guard, None)
    }

    /// [`Ctx::believe`] for a leader's term, whose `status` must say it
    /// leads under the term's fence while the term runs, and no longer
    /// once its lock is lost (by the time the candidate's task has run);
    /// whose `health` reports nothing while the lock is held, nor once the
    /// candidate has dropped the term. (That it reports a term that runs on
    /// past its lock is checked where a term stalls: `Ctx::stall`.)
    pub(super) fn believe_term(
        &self,
        guard: &LockGuard,
        leader: Option<(watch::Receiver<LeaderStatus>, LeaderHealth)>,
    ) -> impl Future<Output = ()> + 'static {
        let (status, health) = leader.unzip();
        let asked = Duration::from_millis(self.ttl_ms.load(Ordering::Relaxed));
        if guard.ttl() != asked {
            self.log.push(Event::Contract {
                client: self.id,
                what: format!(
                    "guard.ttl() is {:?}; the hold asked for {asked:?}",
                    guard.ttl()
                ),
            });
        }
        let lease = guard.lease();
        let (key, fence) = (lease.key().to_owned(), lease.fencing_token());
        self.log.push(Event::Believes {
            client: self.id,
            key: key.clone(),
            fence,
        });
        if let Some(overdue) = health.as_ref().and_then(LeaderHealth::overdue) {
            if !guard.is_lost() {
                self.log.push(Event::Contract {
                    client: self.id,
                    what: format!(
                        "a term on {key} (fence {fence}) holds its lock, yet its leader's health \
                         says it is {overdue:?} overdue"
                    ),
                });
            }
        }
        if let Some(status) = &status {
            let leading = matches!(
                *status.borrow(),
                LeaderStatus::Leading { fencing_token, .. } if fencing_token == fence
            );
            if !leading && !guard.is_lost() {
                self.log.push(Event::Contract {
                    client: self.id,
                    what: format!(
                        "a term on {key} (fence {fence}) runs while the status says {:?}",
                        *status.borrow()
                    ),
                });
            }
        }
        let (log, client, guard) = (self.log.clone(), self.id, guard.clone());
        let (done, ended) = tokio::sync::oneshot::channel();
        tokio::task::spawn_local(async move {
            keeps_its_word(&log, client, &guard, &key).await;
            guard.lost().await;
            keeps_its_word(&log, client, &guard, &key).await;
            if let Some(status) = status {
                // The candidate's task wakes on the same loss: let it run.
                for _ in 0..4 {
                    tokio::task::yield_now().await;
                }
                if matches!(*status.borrow(), LeaderStatus::Leading { fencing_token, .. } if fencing_token == fence)
                {
                    log.push(Event::Contract {
                        client,
                        what: format!("the status still says leading on {key} (fence {fence}) after the term's lock ended"),
                    });
                }
                if let Some(overdue) = health.as_ref().and_then(LeaderHealth::overdue) {
                    log.push(Event::Contract {
                        client,
                        what: format!("the term on {key} (fence {fence}) has ended, yet its leader's health says a term is {overdue:?} overdue"),
                    });
                }
            }
            if !guard.is_lost() {
                log.push(Event::Contract {
                    client,
                    what: format!("lost() resolved on {key} while is_lost() is false"),
                });
            }
            // A loss to renewals that kept failing transiently comes after
            // an early warning (an at-risk episode), never without one.
            if let Some(lost) = guard.failure() {
                let failing = matches!(
                    lost.reason(),
                    LostReason::RenewalFailed | LostReason::Expired
                ) && lost.cause().is_some_and(Error::is_transient);
                if failing && volcano::sim::at_risk_episodes(&guard) == 0 {
                    log.push(Event::Contract {
                        client,
                        what: format!(
                            "{key} was lost to failing renewals without an at_risk warning first: {lost}"
                        ),
                    });
                }
            }
            let why = guard
                .failure()
                .map_or_else(|| "ended".to_owned(), |lost| format!("{:?}", lost.reason()));
            log.push(Event::Ended {
                client,
                key,
                fence,
                why,
            });
            let _ = done.send(());
        });
        async move {
            let _ = ended.await;
        }
    }

    /// The protected work: writes through the gate under each guard, while
    /// they all still hold, until `work` has passed or one is lost.
    pub(super) async fn work(&self, guards: &[&LockGuard], work: Duration) {
        let end = tokio::time::Instant::now() + work;
        let any_lost = || guards.iter().any(|g| g.is_lost());
        while tokio::time::Instant::now() < end && !any_lost() {
            for guard in guards {
                let lease = guard.lease();
                keeps_its_word(&self.log, self.id, guard, lease.key()).await;
                let remaining = guard.remaining();
                let at_risk = (!guard.is_lost()).then(|| guard.at_risk().is_some());
                let accepted = self.gate.write(lease.key(), lease.fencing_token());
                self.log.push(Event::Wrote {
                    client: self.id,
                    key: lease.key().to_owned(),
                    fence: lease.fencing_token(),
                    accepted,
                    remaining,
                    at_risk,
                });
            }
            // One guard waits with `wait_lost`, which must agree with
            // `is_lost()` when it returns (also when its host's suspend
            // ran the deadline out with no task awake to mark it); several
            // with `lost()`.
            // A wait that says "lost" when nothing is, or ends early
            // saying it is not, breaks its word: the work stops there.
            let paused = tokio::time::Instant::now();
            let broken = if let [guard] = guards {
                let said = guard.wait_lost(PAUSE).await;
                (said != guard.is_lost() || (!said && paused.elapsed() < PAUSE)).then(|| {
                    format!(
                        "wait_lost({PAUSE:?}) on {} returned {said} after {:?}; is_lost() is {}",
                        guard.key(),
                        paused.elapsed(),
                        guard.is_lost()
                    )
                })
            } else {
                let lost = guards.iter().map(|g| Box::pin(g.lost()));
                tokio::select! {
                    biased;
                    _ = futures_any(lost) => (!any_lost()).then(|| {
                        "lost() resolved while no guard is_lost()".to_owned()
                    }),
                    () = tokio::time::sleep(PAUSE) => None,
                }
            };
            if let Some(what) = broken {
                self.broken(what);
                break;
            }
        }
    }
}

/// What a guard says about itself agrees with itself: its key, and
/// `is_lost()`, `wait_lost(0)`, `failure()` and `remaining()`; and an
/// early warning its key, its time left and its cause. Checked while it
/// holds and again once it is lost.
async fn keeps_its_word(log: &Log, client: usize, guard: &LockGuard, key: &str) {
    let mut broken = Vec::new();
    if guard.key() != key {
        broken.push(format!("key() is {:?}, its lease's {key:?}", guard.key()));
    }
    let lost = guard.is_lost();
    if guard.wait_lost(Duration::ZERO).await != lost {
        broken.push(format!("wait_lost(0) disagrees with is_lost() ({lost})"));
    }
    if lost && guard.failure().is_none() {
        broken.push("is_lost() without a failure()".to_owned());
    }
    if !lost && guard.remaining().is_zero() {
        broken.push("remaining() is zero while not lost".to_owned());
    }
    if let Some(risk) = guard.at_risk() {
        if risk.key() != key {
            broken.push(format!("at_risk() names {:?}, not {key:?}", risk.key()));
        }
        if guard.is_lost() {
            broken.push(format!("at_risk() while lost: {risk}"));
        }
        if !risk.cause().is_transient() && !matches!(risk.cause(), Error::InvalidResponse(_)) {
            broken.push(format!("at risk for an answer that is a refusal: {risk}"));
        }
        if risk.remaining() > guard.ttl() {
            broken.push(format!("at risk with more than its ttl left: {risk}"));
        }
        // Its time left is to the local deadline; the guard's own may end
        // sooner, at its cap.
        if risk.remaining() < guard.remaining() {
            broken.push(format!(
                "at risk with {:?} left while the guard says {:?}",
                risk.remaining(),
                guard.remaining()
            ));
        }
        if !risk.to_string().contains(key) {
            broken.push(format!("at risk, said without its key: {risk}"));
        }
    }
    for what in broken {
        log.push(Event::Contract { client, what });
    }
}

/// Waits for every future.
pub(super) async fn futures_all(all: Vec<impl Future<Output = ()>>) {
    for f in all {
        f.await;
    }
}

/// Completes when any of `futures` does (never, when there are none).
async fn futures_any<F: Future<Output = ()> + Unpin>(futures: impl Iterator<Item = F>) {
    let mut futures: Vec<F> = futures.collect();
    std::future::poll_fn(|cx| {
        for f in &mut futures {
            if std::pin::Pin::new(f).poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await;
}

impl Ctx {
    /// Kept minimums in depth ([`crate::Depth::KeptMinimums`]).
    pub(super) fn kept_minimums(&self) -> bool {
        self.depth == crate::Depth::KeptMinimums
    }
}
