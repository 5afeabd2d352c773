//! The background renewal task: renews at about half the ttl (ttl/3 for
//! short ttls; see `state::renewal_delay`), retries transient failures
//! inside the safe window, and records a loss when it must stop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::Instrument;

use super::state::State;

use super::{requests, Measured};
use crate::error::{Error, LockLost, LostReason};
use crate::lease::LockLease;
use crate::locks::{Locks, RequestOptions};
use crate::retry::renewal::{BACKOFF_MAX, LAST_ATTEMPT, SAFETY_MARGIN};
use crate::retry::{self, worth_another_attempt};
use crate::validate;

/// Renews until it succeeds, the lease is definitively refused, or no
/// attempt can arrive in time. Each attempt's timeout ends where the safe
/// window ends; transient failures back off with jitter, and a pause that
/// would run past the last moment an attempt can still be sent is cut
/// short, so that attempt is made.
pub(crate) async fn renew_in_window(state: &State, locks: &Locks) -> Result<(), LockLost> {
    renew_in_window_for(state, locks, &|state| Some(state.ttl)).await
}

/// [`renew_in_window`] asking the service for the ttl `ttl` says when
/// each attempt is sent (a kept minimum asks for the time left of it, not
/// the hold's ttl); `None` from it ends the renewal as
/// [`LostReason::MaxHold`] (no renewal fits before the hold's cap).
pub(crate) async fn renew_in_window_for(
    state: &State,
    locks: &Locks,
    ttl: &(dyn Fn(&State) -> Option<Duration> + Sync),
) -> Result<(), LockLost> {
    let mut retrying = Retrying::new();
    let mut tally = Tally::new(state);
    loop {
        if let Some(loss) = state.loss() {
            return Err(loss);
        }
        let renew_by = state.deadline().saturating_sub(SAFETY_MARGIN);
        let budget = renew_by.saturating_sub(state.clock.now());
        if !retry::fits(budget) {
            tally.settle("failed");
            return Err(gave_up(&state.key, retrying.last_error.take()));
        }
        let Some(ttl) = ttl(state) else {
            tally.settle("failed");
            return Err(LockLost::new(state.key.clone(), LostReason::MaxHold));
        };
        let lease = state.lease();
        let request_id = validate::new_uuid();
        tally.sending();
        let result = send(state, locks, &lease, &request_id, budget, ttl).await;
        let err = match result {
            Ok(renewed) => {
                tally.settle("renewed");
                tracing::debug!(
                    key = %state.key,
                    fencing_token = renewed.lease.fencing_token(),
                    request_id,
                    "lock renewed"
                );
                return state.renewed(renewed);
            }
            Err(err)
                if worth_another_attempt(&err)
                    || (sabotaged!(RenewalRetriesConflict)
                        && matches!(err, Error::Conflict(_))) =>
            {
                let err = Arc::new(err);
                state
                    .risk
                    .failing(&state.key, err.clone(), state.remaining());
                err
            }
            Err(err) => {
                tally.settle("failed");
                return Err(
                    LockLost::new(state.key.clone(), LostReason::RenewalFailed).with_cause(err)
                );
            }
        };
        // The last moment a pause may end and still leave one attempt
        // `LAST_ATTEMPT` to arrive.
        let left = renew_by
            .saturating_sub(LAST_ATTEMPT)
            .saturating_sub(state.clock.now());
        let Some(wait) = retrying.pause(&err, left) else {
            tally.settle("failed");
            return Err(gave_up(&state.key, Some(err)));
        };
        tracing::warn!(
            key = %state.key,
            fencing_token = lease.fencing_token(),
            request_id,
            error = %err,
            retry_in_ms = wait.as_millis() as u64,
            "renewal failed; retrying"
        );
        retrying.last_error = Some(err);
        state.sleep_while_held(state.clock.now() + wait).await?;
    }
}

/// One renewal attempt, timed to answer by the end of its `budget`, with
/// the state told while its outcome is unknown.
async fn send(
    state: &State,
    locks: &Locks,
    lease: &LockLease,
    request_id: &str,
    budget: Duration,
    ttl: Duration,
) -> Result<Measured, Error> {
    let timeout = budget.min(locks.client().timeout());
    state.renewal_sent(timeout);
    let options = RequestOptions {
        request_id: Some(request_id.to_owned()),
        timeout: Some(timeout),
    };
    let result = requests::renew(locks, lease, ttl, &options).await;
    let timed_out = matches!(&result, Err(Error::Transport(t)) if t.is_timeout());
    state.renewal_answered(result.as_ref().is_err_and(Error::may_land_late), timed_out);
    result
}

/// The pauses between attempts after transient failures.
struct Retrying {
    backoff: retry::Backoff,
    /// The last transient failure, for the loss if the window closes.
    last_error: Option<Arc<Error>>,
    /// The next attempt is the last one the window has room for.
    last_try: bool,
}

impl Retrying {
    fn new() -> Self {
        Retrying {
            backoff: retry::backoff(BACKOFF_MAX, None),
            last_error: None,
            last_try: false,
        }
    }

    /// How long to pause after `err`, when `left` is the longest pause that
    /// still leaves one attempt; `None` after that last attempt failed.
    /// `Retry-After` is the server's number, and may be huge: the window
    /// decides, and a pause that would end too late is cut to `left`.
    fn pause(&mut self, err: &Error, left: Duration) -> Option<Duration> {
        if self.last_try {
            return None;
        }
        let wanted = self
            .backoff
            .next()
            .unwrap_or(BACKOFF_MAX)
            .max(err.retry_after().unwrap_or_default());
        if wanted >= left {
            self.last_try = true;
            return Some(left);
        }
        Some(wanted)
    }
}

/// The loss when no renewal attempt fits the window any more: the service
/// kept refusing (`503`, `429`, ...) is [`LostReason::RenewalFailed`] with
/// its last answer; no answer before the deadline is
/// [`LostReason::Expired`].
fn gave_up(key: &str, last_error: Option<Arc<Error>>) -> LockLost {
    match last_error {
        Some(err) if !err.is_transport() => {
            LockLost::new(key, LostReason::RenewalFailed).with_shared_cause(err)
        }
        Some(err) => LockLost::new(key, LostReason::Expired).with_shared_cause(err),
        None => LockLost::new(key, LostReason::Expired),
    }
}

/// Counts each renewal attempt once, in `volcano_lock_renewals_total`:
/// `renewed`, `retried` (a transient failure followed by another attempt),
/// or `failed` (the attempt after which the lock was lost). An attempt left
/// open when the renewal is dropped counts as `failed` if the lock was lost
/// by expiry or renewal failure meanwhile; a release that stops the
/// renewal counts nothing.
struct Tally<'a> {
    state: &'a State,
    /// An attempt was sent and its outcome not counted yet.
    open: bool,
}

impl<'a> Tally<'a> {
    fn new(state: &'a State) -> Self {
        Tally { state, open: false }
    }

    fn sending(&mut self) {
        if self.open {
            crate::telemetry::renewal("retried");
        }
        self.open = true;
    }

    fn settle(&mut self, outcome: &'static str) {
        if std::mem::take(&mut self.open) {
            crate::telemetry::renewal(outcome);
        }
    }
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        let lost = self.state.failure().is_some_and(|lost| {
            matches!(
                lost.reason(),
                LostReason::Expired | LostReason::RenewalFailed
            )
        });
        if lost {
            self.settle("failed");
        }
    }
}

/// A hold as the metrics see it: counted in `volcano_lock_held` from
/// acquired until this is dropped, which records its length in
/// `volcano_lock_hold_seconds`.
pub(crate) struct Counted {
    since: Instant,
}

impl Counted {
    pub(crate) fn start() -> Self {
        crate::telemetry::hold_started();
        Counted {
            since: Instant::now(),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        crate::telemetry::hold_ended(self.since.elapsed());
    }
}

/// A hold's renewal task, owned: started when the lock is handed over,
/// aborted when this is dropped or stopped, and the hold's count ends with
/// it. While the task runs it counts in the client's live renewals.
pub(crate) struct Renewal {
    task: JoinHandle<()>,
    _counted: Counted,
}

impl Renewal {
    /// Starts renewing at the state's next due time, in `span`.
    pub(crate) fn start(
        state: &Arc<State>,
        locks: &Locks,
        span: &tracing::Span,
        counted: Counted,
    ) -> Self {
        let counter = locks.client().renewal_counter().clone();
        counter.fetch_add(1, Ordering::SeqCst);
        let live = LiveRenewal(counter);
        let first_at = state.next_renewal_at();
        let task = tokio::spawn(
            renewal_task(state.clone(), locks.clone(), first_at, live).instrument(span.clone()),
        );
        Renewal {
            task,
            _counted: counted,
        }
    }

    /// Stops the task and waits until it has ended.
    pub(crate) async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Decrements the client's live-renewal count when the task ends or is
/// aborted.
struct LiveRenewal(Arc<AtomicUsize>);

impl Drop for LiveRenewal {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Renews at each due time (`next_at`, a lease-clock reading fixed when the
/// lease was obtained, not when the task first runs) until the lock is lost
/// or the task is aborted.
async fn renewal_task(state: Arc<State>, locks: Locks, mut next_at: Duration, _live: LiveRenewal) {
    if sabotaged!(NoRenewal) {
        let _ = state.sleep_while_held(Duration::MAX).await;
        return;
    }
    loop {
        if state.sleep_while_held(next_at).await.is_err() {
            break;
        }
        // Each request's timeout ends before the deadline on the runtime's
        // clock, which stands still through a suspend: a jump of the lease
        // clock is watched beside it, so the loss is announced on time.
        // Boxed: this state is on the heap only while renewing, so a
        // sleeping renewal task stays small.
        let renewed = Box::pin(async {
            tokio::select! {
                biased;
                renewed = renew_in_window(&state, &locks) => renewed,
                loss = state.lost_behind_timers() => Err(loss),
            }
        })
        .await;
        if let Err(lost) = renewed {
            state.mark(lost);
            break;
        }
        if sabotaged!(RenewsOnce) {
            let _ = state.sleep_while_held(Duration::MAX).await;
            break;
        }
        next_at = state.next_renewal_at();
    }
}
