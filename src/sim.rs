//! Hooks for the deterministic simulation (`sim/`, package `volcano-sim`,
//! feature `sim`): the SDK's requests over a simulated network, its random
//! numbers from a seed, and its lease clock on the runtime's (simulated)
//! time. Not an API and not covered by semver.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use crate::error::{Result, TransportKind};
use crate::wire::{Reply, ReplyBody, Wire, WireError, WireFuture};
use crate::{Client, ClientBuilder, LeaseClock};

/// A network that carries one request and brings back its whole answer.
/// It applies the request's own timeout (`request.timeout()`), on the
/// runtime's clock.
pub trait Network: Send + Sync + 'static {
    /// Sends `request`.
    fn send(
        &self,
        request: reqwest::Request,
    ) -> Pin<Box<dyn Future<Output = std::result::Result<Answer, Failure>> + Send + '_>>;
}

/// A whole answer.
#[derive(Debug)]
pub struct Answer {
    /// Its status code.
    pub status: u16,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// Why no answer came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No connection was made: nothing was sent.
    Connect,
    /// The request's timeout ran out: it may have been applied.
    Timeout,
    /// The connection broke mid-request: it may have been applied.
    Io,
}

/// A bug planted on purpose, for the simulation's tests that show it can
/// fail: each must be found within a bounded number of seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// None: the SDK as it is.
    None,
    /// A held lock is released before its guards are told, so they still
    /// believe while another may acquire it.
    ReleaseBeforeMark,
    /// An acquire whose outcome is unknown is never undone.
    NoUndo,
    /// An undo ends at its first answered release: a try of the acquire
    /// that lands later (held in the network, or behind a gateway that
    /// already answered 503/504) keeps the key for its whole ttl under a
    /// token nobody can name.
    UndoEndsAtFirstRelease,
    /// A retry's answer settles whatever the first attempt did
    /// (`retry::settles` always true): a retry answered 409 or 429 erases
    /// the first attempt's unknown outcome, so nothing is undone.
    RetrySettlesAll,
    /// A lease is timed from when its answer arrived, not from when its
    /// request was sent.
    DeadlineFromReceipt,
    /// A waiting acquire keeps trying for 1 s past its deadline.
    TryAfterDeadline,
    /// A refused release is dropped: not recorded for `Client::shutdown`.
    DropRefusedRelease,
    /// A waiter does not ramp: it tries at the poll interval from the
    /// start (a graceful release goes unseen for up to that long).
    NoRamp,
    /// Renewals that fail transiently never put the lock at risk: it is
    /// lost without an early warning.
    NoRiskWarning,
    /// A scope's minimum hold is ignored: the lease is released as soon
    /// as the work ends.
    NoMinHold,
    /// A minimum hold is kept by the process (renewing, then releasing)
    /// instead of by the service: a process that dies during it frees the
    /// key at its ttl, before the minimum's end.
    MinHoldInProcess,
    /// A semaphore tries one permit past its count, as if it were free:
    /// more than the count can be held at once.
    SemaphoreExtraPermit,
    /// A leader's term is dropped as soon as `until` fires, without its
    /// drain: the lock is released while the term may still work.
    NoDrain,
    /// A leader's status still says it leads after its term's lock was
    /// lost, until the next term or the end of `run`.
    StaleLeaderStatus,
    /// An observer compares expiries only: a takeover reads as a renewal.
    ObserveMissesTakeover,
    /// An observer never looks again after its first failed look.
    ObserveStalls,
    /// A leader's health never reports a term that outlived its lock.
    LeaderHealthSilent,
    /// A leader's health keeps reporting a term after it ended.
    LeaderHealthStuck,
    /// A held lock is never renewed: it expires at its first deadline.
    NoRenewal,
    /// An acquire answered 409 is retried at once (the protocol retries
    /// only after a 503 or no answer).
    RetryOn409,
    /// A waiter never tries again after its first look at the holder: it
    /// sleeps to its deadline.
    WaiterStopsTrying,
    /// A waiter's pauses are all 20 ms: it tries in a tight loop.
    WaiterSpins,
    /// A waiter gives up at its first 429, 5xx or transport failure.
    WaiterGivesUpOnError,
    /// A guard renews again as soon as a renewal is answered.
    RenewsInATightLoop,
    /// A guard renews 1.5 s before its local deadline, leaving a slow
    /// answer no room before the protocol's last second.
    RenewsTooLate,
    /// A renewal refused with 409 is retried as if the failure were
    /// transient: the guard believes until its deadline.
    RenewalRetriesConflict,
    /// A guard renews once, then never again: it expires at its second
    /// deadline.
    RenewsOnce,
    /// An at-risk episode never ends when a renewal succeeds: the guard
    /// says it is at risk until the lock ends.
    RiskNeverClears,
    /// A renewal answered without proof the service handled it (no answer,
    /// a gateway's 5xx) is forgotten, and one in flight when the renewal
    /// stops too: a keep that follows does not put the expiry right after
    /// it lands, and the key outlives the kept minimum.
    LateRenewalForgotten,
    /// A semaphore try that does not wait tries two permits at most and
    /// says "every permit taken" with others free.
    SemaphoreTryGivesUpEarly,
    /// A kept minimum's late-window fix-up releases at once instead of
    /// renewing back to the minimum's end.
    KeptSweepReleases,
    /// A keep ignores `max_hold`: the minimum is kept past the cap.
    KeepPastMaxHold,
    /// A leader told to stop while it follows waits for its campaign's
    /// undo to settle before `run` returns.
    FollowerWaitsForUndo,
    /// A semaphore's rounds try the permit this client saw held most
    /// recently first: a waiter keeps trying the same held permit while
    /// another stays free.
    SemaphoreTriesRecentFirst,
    /// `HeldLock::release_reporting` says a minimum kept by the service
    /// was not kept.
    KeptReportedNotKept,
}

thread_local! {
    static SABOTAGE: std::cell::Cell<Sabotage> = const { std::cell::Cell::new(Sabotage::None) };
}

/// Plants `sabotage` in the SDK on this thread (`Sabotage::None` removes it).
pub fn sabotage(sabotage: Sabotage) {
    SABOTAGE.set(sabotage);
}

pub(crate) fn sabotaged(which: Sabotage) -> bool {
    SABOTAGE.get() == which
}

/// From now on this thread runs a simulation: random numbers come from
/// `seed`, and the runtime's clock counts as real. `None` ends it.
pub fn enter(seed: Option<u64>) {
    crate::random::seed(seed);
    crate::realtime::simulate(seed.is_some());
}

/// A client over `network`, whose lease clock is the runtime's clock
/// ([`LeaseClock`] advances on it play suspends; see [`lease_clock`]).
pub fn client(builder: ClientBuilder, network: impl Network) -> Result<Client> {
    builder.build_over(Some(Box::new(Over(network))))
}

/// How many at-risk episodes `guard`'s lease has begun (each one a
/// stretch of failing renewals while the lease was still ours).
pub fn at_risk_episodes(guard: &crate::LockGuard) -> u64 {
    guard.state.risk.episodes()
}

/// The semaphores (name, count) `client` remembers (see
/// `engine/semaphore/memory.rs`), in no particular order.
pub fn remembered_semaphores(client: &Client) -> Vec<(String, u32)> {
    client.semaphores().remembered_names()
}

/// A lease clock on the runtime's clock: `advance` plays a suspend.
pub fn lease_clock() -> LeaseClock {
    LeaseClock::runtime(None)
}

/// [`lease_clock`] on a host whose clock drifts: it runs at `rate` times
/// the runtime's (0.96: 4 % slow).
pub fn drifting_lease_clock(rate: f64) -> LeaseClock {
    LeaseClock::runtime(Some(rate))
}

struct Over<N>(N);

impl<N: Network> Wire for Over<N> {
    fn send(
        &self,
        request: reqwest::Request,
    ) -> WireFuture<'_, std::result::Result<Reply, WireError>> {
        Box::pin(async move {
            match self.0.send(request).await {
                Ok(answer) => Ok(Reply {
                    status: StatusCode::from_u16(answer.status).map_err(|e| WireError {
                        kind: TransportKind::Io,
                        source: Box::new(e),
                    })?,
                    headers: answer.headers,
                    body: Box::new(Whole(Some(answer.body))),
                }),
                Err(failure) => Err(WireError {
                    kind: match failure {
                        Failure::Connect => TransportKind::Connect,
                        Failure::Timeout => TransportKind::Timeout,
                        Failure::Io => TransportKind::Io,
                    },
                    source: format!("simulated network: {failure:?}").into(),
                }),
            }
        })
    }
}

/// A body already read whole.
struct Whole(Option<Bytes>);

impl ReplyBody for Whole {
    fn content_length(&self) -> Option<u64> {
        self.0.as_ref().map(|b| b.len() as u64)
    }

    fn chunk(&mut self) -> WireFuture<'_, std::result::Result<Option<Bytes>, WireError>> {
        let next = self.0.take();
        Box::pin(async move { Ok(next) })
    }
}
