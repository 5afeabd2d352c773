//! Leader election over a lock: campaign (wait for the lock), lead (run the
//! caller's term with a [`LockGuard`]), and when the lease is lost drop the
//! term and campaign again, until the term ends it or `until` fires.
//!
//! What a candidate reports (its status, metrics and running term) is in
//! `leader/report.rs`.

mod report;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::Instrument;

use super::{Owner, Spec};
use crate::error::{Error, LostReason};
use crate::locks::{AcquireOptions, LockGuard, Locks};
use crate::retry::wait::DEFAULT_POLL;
use crate::validate;

pub(crate) use report::{Report, TermSlot};

pub(crate) type Signal = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// How a candidate steps down: when (`until`), and how long its running
/// term may take to return then.
pub(crate) struct Ending {
    pub(crate) until: Option<Signal>,
    pub(crate) drain: Duration,
}

/// How one term ended.
enum TermEnd<E> {
    /// The term function returned.
    Returned(Result<(), E>),
    /// `until` fired: step down (after the drain ran out, if any).
    Resigned,
    /// `until` fired and the term returned within its drain.
    Drained(Result<(), E>),
    /// `until` fired and the lease was lost during the drain.
    LostDraining,
    /// The lease was lost: campaign again.
    Lost,
}

/// How long `run` waits, once `until` fired, for a release or an undo
/// still running in the background: `run` returns within 1 s of `until`
/// when not leading, and within the drain plus 2 s when leading on a
/// healthy service (the term's own release is answered at once there).
pub(crate) const STEP_DOWN_SETTLE: Duration = Duration::from_millis(750);

/// Campaigns and leads on `key` until a term ends leadership or `until`
/// fires; returns once every release under a campaign's token is done (or
/// handed to `Client::shutdown`).
pub(crate) async fn elect<F, Fut, E>(
    locks: Locks,
    key: String,
    ttl: Duration,
    options: AcquireOptions,
    ending: Ending,
    report: Report,
    mut term: F,
) -> std::result::Result<(), E>
where
    F: FnMut(LockGuard) -> Fut + Send,
    Fut: Future<Output = std::result::Result<(), E>> + Send,
    E: From<Error> + Send,
{
    validate::ttl(ttl)?;
    validate::key(&key)?;
    let campaign = Spec::new(&locks, key, ttl, options.wait(Duration::MAX));
    let fired: Arc<Mutex<Option<tokio::time::Instant>>> = Arc::default();
    let until: Signal = match ending.until {
        Some(until) => {
            let fired = fired.clone();
            Box::pin(async move {
                until.await;
                *crate::lock_unpoisoned(&fired) = Some(tokio::time::Instant::now());
            })
        }
        None => Box::pin(std::future::pending()),
    };
    let mut tokens = Vec::new();
    let steps = Steps {
        until,
        drain: ending.drain,
    };
    let result = campaign_and_lead(&campaign, steps, &report, &mut term, &mut tokens).await;
    drop(report);
    // A release under any campaign's token may still be running in the
    // background: an acquire being undone, or a term's release that
    // kept failing. Return once they have finished, within one client
    // timeout (as a held lock's release) when the term or an error ended
    // the run; once `until` fired, within [`STEP_DOWN_SETTLE`] (a pod's
    // grace period is counting). Past that they go on, and
    // `Client::shutdown` waits for them and names their keys.
    let client = locks.client();
    let stepping_down = crate::lock_unpoisoned(&fired).is_some();
    let settle = if stepping_down && !sabotaged!(FollowerWaitsForUndo) {
        STEP_DOWN_SETTLE
    } else {
        client.timeout()
    };
    if !client
        .background()
        .await_releases(&campaign.key, &tokens, settle)
        .await
    {
        tracing::warn!(
            key = %campaign.key,
            "leader's release still running in the background; Client::shutdown waits for it"
        );
    }
    result
}

/// `until`, and the drain it starts.
struct Steps {
    until: Signal,
    drain: Duration,
}

/// The campaign-and-term loop of [`Leader::run`]; every token it uses is
/// pushed to `tokens`.
async fn campaign_and_lead<F, Fut, E>(
    campaign: &Spec,
    steps: Steps,
    report: &Report,
    term: &mut F,
    tokens: &mut Vec<String>,
) -> std::result::Result<(), E>
where
    F: FnMut(LockGuard) -> Fut + Send,
    Fut: Future<Output = std::result::Result<(), E>> + Send,
    E: From<Error> + Send,
{
    let key = &campaign.key;
    let Steps { mut until, drain } = steps;
    loop {
        let (mut this, span) = next_campaign(campaign, tokens);
        this.reach = Some(report.campaigning());
        // The campaign's future is dropped before the arms run: what it may
        // have obtained is then being released in the background.
        let campaigned = tokio::select! {
            biased;
            _ = &mut until => return Ok(()),
            held = super::hold::hold(this, Some(span.clone())) => held,
        };
        let held = match campaigned {
            Ok(held) => held,
            // The pre-run renewal found no safe window: try again.
            Err(Error::LockLost(_)) => continue,
            Err(err) => return Err(E::from(err)),
        };
        let fencing_token = held.lease().fencing_token();
        tracing::info!(key = %key, fencing_token, "elected leader");
        report.elected(fencing_token);

        let guard = LockGuard::clone(&held);
        report.term.began(&guard);
        let end = {
            let work = term(guard.clone()).instrument(span.clone());
            tokio::pin!(work);
            // Once `until` fired: when the drain runs out.
            let mut draining: Option<Pin<Box<tokio::time::Sleep>>> = None;
            loop {
                // Read each time round, not only when the arm fires: a
                // change between that and the next subscription (or a
                // risk already under way when the term began) still shows.
                if draining.is_none() {
                    report.at_risk(guard.at_risk().is_some());
                }
                tokio::select! {
                    biased;
                    _ = &mut until, if draining.is_none() => {
                        if drain.is_zero() || sabotaged!(NoDrain) {
                            break TermEnd::Resigned;
                        }
                        tracing::info!(key = %key, fencing_token, drain_ms = drain.as_millis() as u64, "stepping down: the term drains");
                        guard.state.stepping_down.send_replace(true);
                        report.stepping_down(fencing_token);
                        draining = Some(Box::pin(tokio::time::sleep(drain)));
                    }
                    _ = guard.lost() => break if draining.is_some() {
                        TermEnd::LostDraining
                    } else {
                        TermEnd::Lost
                    },
                    result = &mut work => break match draining {
                        Some(_) => TermEnd::Drained(result),
                        None => TermEnd::Returned(result),
                    },
                    () = async { draining.as_mut().expect("draining").await }, if draining.is_some() => {
                        tracing::warn!(key = %key, fencing_token, "the term did not return within its drain: dropped");
                        break TermEnd::Resigned;
                    }
                    () = guard.at_risk_changed(), if draining.is_none() => {}
                }
            }
        };
        // Not leading from here on, whatever the release says.
        report.term.ended();
        report.ended(match &end {
            TermEnd::Lost => guard
                .failure()
                .map_or("lost", |lost| crate::telemetry::reason(lost.reason())),
            TermEnd::LostDraining => guard
                .failure()
                .map_or("lost", |lost| crate::telemetry::reason(lost.reason())),
            TermEnd::Resigned | TermEnd::Drained(_) => "resigned",
            TermEnd::Returned(_) => "returned",
        });
        // The term's future is gone before anything else happens.
        let (loss, released) = held.finish().await;
        // A final release that found another token holding the lock: the
        // term ran, at least in part, without it.
        let released = match loss {
            Some(taken) if taken.reason() == LostReason::TakenOver => Err(Error::LockLost(taken)),
            _ => released,
        };
        match end {
            TermEnd::Lost => {
                let lost = guard.failure();
                let reason = lost.as_ref().map(|l| l.to_string());
                tracing::warn!(key = %key, fencing_token, reason, "leadership lost; campaigning again");
                let capped = lost.is_some_and(|l| l.reason() == LostReason::MaxHold);
                if capped && !make_way(campaign, &mut until).await {
                    return released.map_err(E::from);
                }
            }
            TermEnd::Resigned => {
                tracing::info!(key = %key, fencing_token, "resigned leadership");
                return released.map_err(E::from);
            }
            // Cut short mid-drain: the work in hand may not have finished.
            TermEnd::LostDraining => {
                let lost = guard.failure();
                tracing::warn!(
                    key = %key,
                    fencing_token,
                    reason = lost.as_ref().map(|l| l.to_string()),
                    "leadership lost while the term drained; stepped down"
                );
                return match lost {
                    Some(lost) => Err(E::from(Error::LockLost(lost))),
                    None => released.map_err(E::from),
                };
            }
            TermEnd::Drained(result) => {
                tracing::info!(key = %key, fencing_token, "resigned leadership once the term returned");
                return result.and(released.map_err(E::from));
            }
            TermEnd::Returned(result) => {
                tracing::info!(key = %key, fencing_token, "leadership ended by its term");
                return result.and(released.map_err(E::from));
            }
        }
    }
}

/// One campaign: one token for the whole wait, a fresh one per term, so a
/// new term is always a new acquisition with a higher fencing token. The
/// SDK generates it, so an acquire whose outcome is unknown is undone;
/// knowing it (in `tokens`), `run` can wait for that undo before it
/// returns. One span per campaign and term, under the caller's: the
/// acquire, renewals, release and the term itself log in it.
fn next_campaign(campaign: &Spec, tokens: &mut Vec<String>) -> (Spec, tracing::Span) {
    let span = tracing::info_span!(
        "volcano.leader",
        key = %campaign.key,
        fencing_token = tracing::field::Empty
    );
    let token = validate::new_uuid();
    tokens.push(token.clone());
    let mut this = campaign.clone();
    this.owner = Owner::Sdk(token);
    (this, span)
}

/// After a term ended by its cap, gives the others a chance: they try
/// every poll interval, so this waits about one before campaigning again.
/// False if `until` fired meanwhile (step down).
async fn make_way(campaign: &Spec, until: &mut Signal) -> bool {
    let poll = campaign.options.poll_interval.unwrap_or(DEFAULT_POLL);
    let pause = poll.mul_f64(1.0 + 0.2 * crate::random::unit());
    tokio::select! {
        biased;
        _ = until => false,
        _ = tokio::time::sleep(pause) => true,
    }
}
