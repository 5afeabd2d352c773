//! The tries of one acquisition ([`Try`]): one acquire sent, and the loop
//! that waits for a held lock, taking turns with this client's other
//! waiters on the key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::undo::Undo;
use super::Measured;
use crate::error::{Error, Result};
use crate::locks::engine::{requests, wait, Reach};
use crate::locks::{Locks, RequestOptions};
use crate::ops;
use crate::retry::wait::LAST_TRY_LEAD;
use tokio::time::Instant;

/// The tries of one acquisition: the same token and request id each time.
pub(super) struct Try<'a> {
    pub(super) locks: &'a Locks,
    pub(super) key: &'a str,
    pub(super) ttl: u64,
    pub(super) token: &'a str,
    pub(super) request_id: &'a str,
    pub(super) timeout: Option<Duration>,
    pub(super) reach: Option<&'a Reach>,
}

impl Try<'_> {
    /// Tries until acquired, a definitive error, or the waiter's deadline,
    /// looking at the holder (`get`) where the waiter says (see [`wait`]).
    /// No try starts after the deadline; one in flight then gets a bounded
    /// grace to answer (see [`wait::Window`]).
    pub(super) async fn wait_for(
        &self,
        mut waiter: wait::Waiter,
        undo: &mut Undo<'_>,
    ) -> Result<Measured> {
        let mut then = wait::Then::Acquire;
        // Waiters of this client on this key take turns, in the order they
        // began: only the first in line sends. One behind it tries once of
        // its own just before its deadline, so that what it returns is an
        // answer it got (the key may be free, or the service unreachable).
        let mut ticket = self.locks.client().turns().join(self.key);
        let mut last_try_made = false;
        // Behind another, this waiter sends nothing: what the first in
        // line says of the service is what it tells its leader's status;
        // `line_said` until its own tries are answered.
        let mut line = ticket.line_failing();
        let mut line_said = false;
        loop {
            while !ticket.is_first() {
                let wake = if last_try_made {
                    waiter.remaining()
                } else {
                    waiter.remaining().saturating_sub(LAST_TRY_LEAD)
                };
                tokio::select! {
                    biased;
                    () = ticket.first() => {
                        then = wait::Then::Acquire;
                        break;
                    }
                    Ok(()) = line.changed(), if self.reach.is_some() => {
                        let since = *line.borrow_and_update();
                        if let Some(reach) = self.reach {
                            line_said = since.is_some();
                            reach(since);
                        }
                    }
                    () = tokio::time::sleep(wake) => {
                        if last_try_made {
                            if let Some(err) = waiter.timed_out() {
                                return Err(err);
                            }
                        }
                        last_try_made = true;
                        then = wait::Then::Acquire;
                        break;
                    }
                }
            }
            // What the last try said, for the log: held, or its error.
            let mut failed: Option<String> = None;
            let step = match then {
                wait::Then::Acquire => {
                    ticket.trying();
                    let window = waiter.window();
                    // This client's count of releases of the key as the
                    // transport's retry went, if it did.
                    let retried = AtomicU64::new(u64::MAX);
                    let note = || retried.store(ticket.freed_count(), Ordering::Relaxed);
                    let result = self.once(window, undo, Some(&note)).await;
                    let at_retry = Some(retried.load(Ordering::Relaxed)).filter(|n| *n != u64::MAX);
                    match result {
                        Ok(measured) => {
                            // Answered: a leader's status stops saying
                            // unreachable even if its term never begins
                            // (lost at once, say after a suspend).
                            if ticket.is_first() {
                                ticket.tell_failing(None);
                            }
                            if waiter.failing_since().is_some() || line_said {
                                if let Some(reach) = self.reach {
                                    reach(None);
                                }
                            }
                            return Ok(measured);
                        }
                        Err(err) => {
                            if let Some(count) = at_retry {
                                // The transport's retry went: a release of
                                // this client's before it is older than
                                // the retry, which tried after it, and no
                                // news; one after it is (the retry may have
                                // been decided before it, its answer slow:
                                // 16-client seed 373). So also when the
                                // retry got no answer but a 503: trying
                                // again at once would be a second retry
                                // (kept-minimums seed 166).
                                ticket.answered_after(count);
                            }
                            let was = waiter.failing_since();
                            waiter.failed(&err);
                            self.log_episode(waiter.episode(), &err);
                            let now = waiter.failing_since();
                            if ticket.is_first() {
                                ticket.tell_failing(now);
                            }
                            let told_by_line = std::mem::take(&mut line_said);
                            if let (Some(reach), true) = (self.reach, was != now || told_by_line) {
                                reach(now);
                            }
                            if !err.is_lock_held() {
                                failed = Some(crate::error::chain(&err));
                            }
                            waiter.after(err)
                        }
                    }
                }
                wait::Then::LookAtHolder => {
                    let limit = waiter.remaining().min(self.locks.client().timeout());
                    let look = RequestOptions {
                        request_id: None,
                        timeout: Some(limit),
                    };
                    let got = requests::get(self.locks, self.key, &look).await;
                    let holder = got.map(|(state, date)| wait::Holder {
                        held: state.held(),
                        expires_at: state.expires_at(),
                        date,
                    });
                    waiter.looked(holder)
                }
            };
            let pause = match step {
                wait::Step::Stop(err) => return Err(err),
                wait::Step::Retry { pause, then: next } => {
                    then = next;
                    pause
                }
            };
            // Not before the window a 429 to any of this client's requests
            // named (then spread, so that its waiters do not all try at
            // that moment).
            let pause = match self.locks.client().quota().quiet_until() {
                Some(quiet) if quiet > Instant::now() => pause.max(waiter.until_quota(quiet)),
                _ => pause,
            };
            match &failed {
                None => tracing::debug!(
                    key = %self.key,
                    request_id = self.request_id,
                    pause_ms = pause.as_millis() as u64,
                    then = ?then,
                    "lock held; waiting"
                ),
                Some(error) => tracing::debug!(
                    key = %self.key,
                    request_id = self.request_id,
                    error,
                    pause_ms = pause.as_millis() as u64,
                    then = ?then,
                    "acquire failed; trying again"
                ),
            }
            if ticket.is_first() {
                tokio::select! {
                    biased;
                    // This client freed the key: try now.
                    () = ticket.freed() => then = wait::Then::Acquire,
                    () = tokio::time::sleep(pause.min(waiter.remaining())) => {}
                }
            }
            if let Some(err) = waiter.timed_out() {
                return Err(err);
            }
        }
    }

    /// Says at WARN when a wait's tries have failed without an answer for
    /// a while (a leader that cannot reach the service would otherwise
    /// wait in silence), and at INFO when answers come back.
    fn log_episode(&self, episode: Option<wait::Episode>, err: &Error) {
        match episode {
            Some(wait::Episode::Unanswered(failing)) => tracing::warn!(
                key = %self.key,
                error = %crate::error::chain(err),
                failing_secs = failing.as_secs(),
                "acquire keeps failing without an answer about the lock; still trying"
            ),
            Some(wait::Episode::Answered) => tracing::info!(
                key = %self.key,
                "the lock service answers again; still waiting for the lock"
            ),
            None => {}
        }
    }

    /// One acquire (with the transport's single retry on transport failure
    /// or 503), with the lease-clock reading taken before it was sent.
    pub(super) async fn once(
        &self,
        window: wait::Window,
        undo: &mut Undo<'_>,
        on_retry: Option<&(dyn Fn() + Sync)>,
    ) -> Result<Measured> {
        let clock = self.locks.client().lease_clock();
        let sent_at = clock.now();
        undo.sending();
        let op = ops::Acquire {
            key: self.key,
            token: self.token,
            ttl_secs: self.ttl,
        };
        let result = requests::send_noting_retry(
            self.locks,
            &op,
            self.request_id,
            self.timeout,
            window,
            on_retry,
        )
        .await;
        if result.as_ref().is_ok_and(|answer| answer.after_uncertain) {
            // Granted by the retry; the first attempt may still land.
            undo.unknown_from_now();
        }
        let result = result.map(|answer| Measured::new(answer.value, sent_at, answer.date, clock));
        undo.answered(&result);
        let measured = result?;
        tracing::debug!(
            key = measured.lease.key(),
            fencing_token = measured.lease.fencing_token(),
            request_id = self.request_id,
            "lock acquired"
        );
        Ok(measured)
    }
}
