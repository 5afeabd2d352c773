//! What a client host runs: a seeded program of lock operations through
//! the real SDK (hold, with `max_hold` and a request timeout at times;
//! with_lock; try_with_lock; hold_all and with_locks over every key; a
//! waiting acquire with renew and release; leader; a hold under the
//! program's own token, recovered the documented way; force-release),
//! waiting with the default poll interval or a much shorter one. Some
//! operations are dropped, at a random time or just after one of their
//! requests went out; then `shutdown`. Every belief that it holds a key is
//! logged with the guard's fence, and ended when the guard says it is lost
//! or released.
//!
//! This file is the program's loop: it draws each step from the seed and
//! drops some. Which operation a step performs is `program/op.rs`; how
//! each is done, `program/steps.rs`; what they share (the log, the fenced
//! store, beliefs and the work under a guard), `program/ctx.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use volcano::Client;

use self::ctx::Ctx;
use self::op::{poll_for, uuid_from, Op, DRAWS};
use crate::log::{Event, Log};
use crate::net::{SimNetwork, PORT, SERVER};

mod ctx;
mod lead;
mod observing;
mod op;
mod own;
mod sets;
mod steps;

pub(crate) use self::ctx::Gate;

/// The service key of the simulated server.
pub(crate) const SERVICE_KEY: &str = "sim-service-key";
/// Each request's timeout.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);

/// One client's program and what it shares with the driver.
pub(crate) struct Program {
    pub(crate) id: usize,
    pub(crate) seed: u64,
    pub(crate) keys: Vec<String>,
    pub(crate) steps: usize,
    pub(crate) log: Log,
    pub(crate) gate: Gate,
    pub(crate) senders: crate::net::Senders,
    /// The client's lease clock, for the driver's suspends.
    pub(crate) clock: Arc<Mutex<Option<volcano::LeaseClock>>>,
    /// The rate the host's clock runs at (`None`: exactly).
    pub(crate) clock_rate: Option<f64>,
    /// [`Options::depth`](crate::Options::depth).
    pub(crate) depth: crate::Depth,
    /// The server, read directly (not over the network) once `shutdown`
    /// has returned.
    pub(crate) server: Arc<Mutex<Option<volcano_mock_server::MockServer>>>,
}

impl Program {
    pub(crate) async fn run(self) -> turmoil::Result {
        let clock = match self.clock_rate {
            Some(rate) => volcano::sim::drifting_lease_clock(rate),
            None => volcano::sim::lease_clock(),
        };
        *crate::lock(&self.clock) = Some(clock.clone());
        let builder = Client::builder()
            .api_url(format!("http://{SERVER}:{PORT}"))
            .allow_insecure_http(true)
            .service_key(SERVICE_KEY)
            .timeout(TIMEOUT)
            .lease_clock(clock.clone());
        let (sent_count, requests) = tokio::sync::watch::channel(0);
        let network = SimNetwork {
            client: self.id,
            timeout: TIMEOUT,
            senders: self.senders.clone(),
            sent_count,
        };
        let client = volcano::sim::client(builder, network)?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut ctx = Ctx::new(
            self.id,
            (client.locks(), clock),
            self.log.clone(),
            self.gate.clone(),
            self.server.clone(),
            requests.clone(),
        );
        ctx.depth = self.depth;
        if self.depth == crate::Depth::Permits && self.id == 0 {
            ctx.forgets_idle_semaphores().await;
        }
        // Observers in depth: the others hold for as long as the first
        // observes.
        let steps = match self.depth {
            crate::Depth::Observers if self.id > 0 => self.steps * 2,
            _ => self.steps,
        };
        for _ in 0..steps {
            let key = self.keys[rng.random_range(0..self.keys.len())].clone();
            let ttl = Duration::from_secs(rng.random_range(5..=12));
            let op = Op::pick(rng.random_range(0..DRAWS));
            // Observers in depth: the first program only observes, the
            // others hold, renew, let lapse and take over.
            let op = match self.depth {
                crate::Depth::Observers if self.id == 0 => Op::Observe,
                depth => op.in_depth(depth),
            };
            let mut work = Duration::from_millis(rng.random_range(0..8_000));
            // Observers in depth: held long enough (up to 32 s) to be seen
            // renewed from one regular look to the next.
            if self.depth == crate::Depth::Observers && self.id > 0 {
                work *= 4;
            }
            // Some operations are abandoned: at a random time, or just
            // after one of their requests went out (where an outcome is
            // most often unknown).
            let drop_after = rng.random_bool(0.2).then(|| {
                let after = Duration::from_millis(rng.random_range(0..6_000));
                let nth = rng.random_bool(0.5).then(|| rng.random_range(1..=4));
                let settle = Duration::from_millis(rng.random_range(0..300));
                (after, nth, settle)
            });
            let coin: u64 = rng.random();
            // How long this operation waits for a held key, if it does.
            if let Some(wait) = op
                .waits(coin, work)
                .filter(|_| !op.takes_a_permit(coin, self.depth))
            {
                let until = turmoil::sim_elapsed().unwrap_or_default() + wait;
                self.log.push(Event::Waits {
                    client: self.id,
                    key: key.clone(),
                    until,
                    how: op.waiting(),
                    poll: poll_for(coin),
                });
            }
            let step = ctx.step(op, key.clone(), ttl, work, coin, &self.keys);
            match drop_after {
                Some(drop_at) => {
                    tokio::select! {
                        biased;
                        () = step => {}
                        () = drop_point(drop_at, requests.clone()) => {
                            ctx.note("dropped an operation");
                            // The SDK undoes what it started under its own
                            // tokens; under the program's own, the program
                            // does, with an idempotent release.
                            if op == Op::OwnToken {
                                ctx.recover_own(&key, uuid_from(coin), ttl).await;
                            }
                        }
                    }
                }
                None => step.await,
            }
            self.log.push(Event::StepEnded { client: self.id });
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..2_000))).await;
        }
        let mut unreleased = client.shutdown(Duration::from_secs(120)).await;
        unreleased.sort();
        let live_then = crate::lock(&self.server)
            .as_ref()
            .map(|server| server.locks())
            .unwrap_or_default()
            .into_iter()
            .filter(|lock| lock.live)
            .map(|lock| (lock.key, lock.fencing_token))
            .collect();
        self.log.push(Event::Done {
            client: self.id,
            unreleased,
            live_then,
            renewing: client.active_renewals(),
        });
        Ok(())
    }
}

/// When to drop an operation: `after` it began, or, with `nth`, `settle`
/// after its nth request was sent (never, if it sends fewer).
async fn drop_point(
    (after, nth, settle): (Duration, Option<u64>, Duration),
    mut requests: tokio::sync::watch::Receiver<u64>,
) {
    let Some(nth) = nth else {
        return tokio::time::sleep(after).await;
    };
    let target = *requests.borrow_and_update() + nth;
    if requests.wait_for(|n| *n >= target).await.is_err() {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(settle).await;
}
