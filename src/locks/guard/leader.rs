//! Leader election over a lock: campaign (wait for the lock), lead (run the
//! caller's term with a [`LockGuard`]), and when the lease is lost drop the
//! term and campaign again, until the term ends it or `until` fires.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tracing::Instrument;

use super::handle::LockGuard;
use super::held::Hold;
use crate::error::{Error, LostReason};
use crate::locks::{Acquire, Locks, Owner};
use crate::retry::wait::DEFAULT_POLL;
use crate::validate;

type Signal = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// `locks.leader(key, ttl)`; see [`Locks::leader`].
#[must_use = "leader election starts only when run(..) is awaited"]
pub struct Leader {
    /// How every campaign acquires and holds the lock (its token is
    /// generated per campaign).
    campaign: Hold,
    until: Option<Signal>,
}

impl std::fmt::Debug for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leader")
            .field("campaign", &self.campaign)
            .field("until", &self.until.as_ref().map(|_| "..."))
            .finish()
    }
}

/// How one term ended.
enum TermEnd<E> {
    /// The term function returned.
    Returned(Result<(), E>),
    /// `until` fired: step down.
    Resigned,
    /// The lease was lost: campaign again.
    Lost,
}

impl Locks {
    /// Leader election on `key`: among all callers of `leader` on this key,
    /// one at a time leads.
    ///
    /// `run(term)` campaigns (waits for the lock, quota-aware like
    /// [`Acquire::wait`](crate::Acquire::wait)), then calls `term` with a
    /// [`LockGuard`] and polls its future while it leads. If the lease is
    /// lost, that future is dropped, the lock released, and the campaign
    /// starts again with a fresh token. `term` returning `Ok(())` ends
    /// leadership (release, then `Ok`); `Err(e)` releases and returns
    /// `Err(e)`; after either, `term` is not called again.
    /// [`Leader::until`] steps down cleanly when a shutdown signal fires.
    /// `run` returns only after its release has finished.
    ///
    /// Followers wait quota-aware: each costs about one `get` per lease
    /// period plus `60 / interval` acquires a minute, where the interval is
    /// [`Leader::poll_interval`] (default 10 s). A leader that steps down
    /// is replaced within about one interval, one that crashed within
    /// ttl + 1 s. [`Leader::max_hold`] caps each term.
    ///
    /// Every term's fencing token is higher than the previous term's (each
    /// term is a new acquisition): hand it to the resource you protect, so
    /// a deposed leader that has not noticed yet cannot overwrite the new
    /// one's work.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
    /// locks
    ///     .leader("scheduler", Duration::from_secs(15))
    ///     .until(shutdown)
    ///     .run(|term| async move {
    ///         let fence = term.lease().fencing_token();
    ///         loop {
    ///             // schedule jobs, writing with `fence` so the store
    ///             // rejects a deposed leader's late writes
    ///             # let _ = fence;
    ///             tokio::time::sleep(Duration::from_secs(1)).await;
    ///         }
    ///         #[allow(unreachable_code)]
    ///         Ok::<(), volcano::Error>(())
    ///     })
    ///     .await
    /// # }
    /// ```
    pub fn leader(&self, key: impl Into<String>, ttl: Duration) -> Leader {
        Leader {
            campaign: self.hold(key, ttl).wait(Duration::MAX),
            until: None,
        }
    }
}

acquisition_setters!(impl[] Leader {
    poll_interval,
    max_hold,
});

impl Leader {
    fn acquire_spec(&mut self) -> &mut Acquire {
        &mut self.campaign.acquire
    }

    fn hold_spec(&mut self) -> &mut Hold {
        &mut self.campaign
    }

    /// Step down (drop the running term, release, return `Ok(())`) once
    /// `signal` completes, for example on SIGTERM.
    pub fn until(mut self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        self.until = Some(Box::pin(signal));
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
        Box::pin(self.elect(term))
    }

    async fn elect<F, Fut, E>(self, mut term: F) -> std::result::Result<(), E>
    where
        F: FnMut(LockGuard) -> Fut + Send,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: From<Error> + Send,
    {
        let Leader { campaign, until } = self;
        let locks = campaign.acquire.common.locks.clone();
        let key = campaign.key().to_owned();
        validate::ttl(campaign.acquire.ttl)?;
        validate::key(&key)?;
        let until: Signal = until.unwrap_or_else(|| Box::pin(std::future::pending()));
        let mut tokens = Vec::new();
        let result = campaign_and_lead(&campaign, until, &mut term, &mut tokens).await;
        // A release under any campaign's token may still be running in the
        // background: an acquire being undone, or a term's release that
        // kept failing. Return only once they have finished (within one
        // client timeout, as a held lock's release; past it they go on,
        // and `Client::shutdown` waits for them).
        let client = locks.client();
        if !client
            .background()
            .await_releases(&key, &tokens, client.timeout())
            .await
        {
            tracing::warn!(
                key = %key,
                "leader's release still running in the background; Client::shutdown waits for it"
            );
        }
        result
    }
}

/// The campaign-and-term loop of [`Leader::run`]; every token it uses is
/// pushed to `tokens`.
async fn campaign_and_lead<F, Fut, E>(
    campaign: &Hold,
    mut until: Signal,
    term: &mut F,
    tokens: &mut Vec<String>,
) -> std::result::Result<(), E>
where
    F: FnMut(LockGuard) -> Fut + Send,
    Fut: Future<Output = std::result::Result<(), E>> + Send,
    E: From<Error> + Send,
{
    let key = campaign.key();
    loop {
        let (this, span) = next_campaign(campaign, tokens);
        // The campaign's future is dropped before the arms run: what it may
        // have obtained is then being released in the background.
        let campaigned = tokio::select! {
            biased;
            _ = &mut until => return Ok(()),
            held = this => held,
        };
        let held = match campaigned {
            Ok(held) => held,
            // The pre-run renewal found no safe window: try again.
            Err(Error::LockLost(_)) => continue,
            Err(err) => return Err(E::from(err)),
        };
        let fencing_token = held.lease().fencing_token();
        tracing::info!(key = %key, fencing_token, "elected leader");

        let guard = LockGuard::clone(&held);
        let end = {
            let work = term(guard.clone()).instrument(span.clone());
            tokio::select! {
                biased;
                _ = &mut until => TermEnd::Resigned,
                _ = guard.lost() => TermEnd::Lost,
                result = work => TermEnd::Returned(result),
            }
        };
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
fn next_campaign(campaign: &Hold, tokens: &mut Vec<String>) -> (Hold, tracing::Span) {
    let span = tracing::info_span!(
        "volcano.leader",
        key = %campaign.key(),
        fencing_token = tracing::field::Empty
    );
    let token = validate::new_uuid();
    tokens.push(token.clone());
    let mut this = campaign.clone();
    this.acquire.token = Owner::Sdk(token);
    this.span = Some(span.clone());
    (this, span)
}

/// After a term ended by its cap, gives the others a chance: they try
/// every poll interval, so this waits about one before campaigning again.
/// False if `until` fired meanwhile (step down).
async fn make_way(campaign: &Hold, until: &mut Signal) -> bool {
    let poll = campaign.acquire.poll_interval.unwrap_or(DEFAULT_POLL);
    let pause = poll.mul_f64(1.0 + 0.2 * crate::random::unit());
    tokio::select! {
        biased;
        _ = until => false,
        _ = tokio::time::sleep(pause) => true,
    }
}
