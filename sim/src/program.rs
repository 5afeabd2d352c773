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

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use volcano::{Client, LockGuard, Locks};

use crate::log::{Event, Log, Waiting};
use crate::net::{SimNetwork, PORT, SERVER};

/// The service key of the simulated server.
pub(crate) const SERVICE_KEY: &str = "sim-service-key";
/// Each request's timeout.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The operation that acquires under the program's own token.
const OWN_TOKEN: u32 = 14;

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
    /// The server, read directly (not over the network) once `shutdown`
    /// has returned.
    pub(crate) server: Arc<Mutex<Option<volcano_mock_server::MockServer>>>,
}

impl Program {
    pub(crate) async fn run(self) -> turmoil::Result {
        let clock = volcano::sim::lease_clock();
        *crate::lock(&self.clock) = Some(clock.clone());
        let builder = Client::builder()
            .api_url(format!("http://{SERVER}:{PORT}"))
            .allow_insecure_http(true)
            .service_key(SERVICE_KEY)
            .timeout(TIMEOUT)
            .lease_clock(clock);
        let (sent_count, requests) = tokio::sync::watch::channel(0);
        let network = SimNetwork {
            client: self.id,
            timeout: TIMEOUT,
            senders: self.senders.clone(),
            sent_count,
        };
        let client = volcano::sim::client(builder, network)?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let ctx = Ctx {
            id: self.id,
            locks: client.locks(),
            log: self.log.clone(),
            gate: self.gate.clone(),
            ttl_ms: Default::default(),
        };
        for _ in 0..self.steps {
            let key = self.keys[rng.random_range(0..self.keys.len())].clone();
            let ttl = Duration::from_secs(rng.random_range(5..=12));
            let op = rng.random_range(0..16);
            let work = Duration::from_millis(rng.random_range(0..8_000));
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
            let waits = match op {
                0..=5 | 8 | 9 | 12..=14 => Some(Duration::from_millis(coin % 20_000)),
                10 => Some(work * 3),
                _ => None,
            };
            if let Some(wait) = waits {
                let until = turmoil::sim_elapsed().unwrap_or_default() + wait;
                self.log.push(Event::Waits {
                    client: self.id,
                    key: key.clone(),
                    until,
                    how: match op {
                        10 => Waiting::Campaign,
                        12 | 13 => Waiting::Set,
                        _ => Waiting::Acquire,
                    },
                    poll: match op {
                        10 => Duration::from_secs(10),
                        _ => poll_for(coin),
                    },
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
                            if op == OWN_TOKEN {
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
        });
        Ok(())
    }
}

/// What an operation needs.
struct Ctx {
    id: usize,
    locks: Locks,
    log: Log,
    gate: Gate,
    /// The TTL the current operation asked for, in milliseconds.
    ttl_ms: std::sync::atomic::AtomicU64,
}

impl Ctx {
    fn note(&self, what: impl Into<String>) {
        self.log.push(Event::Note {
            client: self.id,
            what: what.into(),
        });
    }

    /// One operation; `op` picks which.
    async fn step(
        &self,
        op: u32,
        key: String,
        ttl: Duration,
        work: Duration,
        coin: u64,
        all: &[String],
    ) {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.ttl_ms
            .store(ttl_ms, std::sync::atomic::Ordering::Relaxed);
        let wait = Duration::from_millis(coin % 20_000);
        let locks = &self.locks;
        match op {
            0..=2 => match self.shaped_hold(&key, ttl, wait, coin).await {
                Ok(held) => self.use_held(held, work, coin).await,
                Err(err) => self.note(format!("hold {key}: {err}")),
            },
            3..=5 => {
                let scope = locks.with_lock(&key, ttl, |guard| async move {
                    let ended = self.believe(&guard);
                    self.work(&[&guard], work).await;
                    Ok::<_, volcano::Error>(ended)
                });
                match scope.wait(wait).poll_interval(poll_for(coin)).await {
                    Ok(ended) => ended.await,
                    Err(err) => self.note(format!("with_lock {key}: {err}")),
                }
            }
            6 | 7 => {
                let scope = locks.try_with_lock(&key, ttl, |guard| async move {
                    let ended = self.believe(&guard);
                    self.work(&[&guard], work).await;
                    Ok::<_, volcano::Error>(ended)
                });
                match scope.await {
                    Ok(Some(ended)) => ended.await,
                    Ok(None) => self.note(format!("try_with_lock {key}: held elsewhere")),
                    Err(err) => self.note(format!("try_with_lock {key}: {err}")),
                }
            }
            8 | 9 => self.plain(&key, ttl, wait, coin).await,
            10 => self.lead(&key, ttl, work).await,
            12 => self.hold_all(all, ttl, wait, work, coin).await,
            13 => {
                let scope = locks.with_locks(all.to_vec(), ttl, |set| async move {
                    let guards: Vec<LockGuard> =
                        set.keys().filter_map(|k| set.guard(k)).cloned().collect();
                    self.whole_set(guards.len(), all.len());
                    let ended: Vec<_> = guards.iter().map(|g| self.believe(g)).collect();
                    self.work(&guards.iter().collect::<Vec<_>>(), work).await;
                    Ok::<_, volcano::Error>(ended)
                });
                match scope.wait(wait).poll_interval(poll_for(coin)).await {
                    Ok(ended) => futures_all(ended).await,
                    Err(err) => self.note(format!("with_locks: {err}")),
                }
            }
            OWN_TOKEN => self.own_token(&key, ttl, wait, work, coin).await,
            _ => match locks.force_release(&key).await {
                Ok(()) => self.log.push(Event::Forced {
                    client: self.id,
                    key,
                }),
                Err(err) => self.note(format!("force_release {key}: {err}")),
            },
        }
    }

    /// Logs how a release of `key` ended.
    fn released(&self, key: &str, result: volcano::Result<()>) {
        match result {
            Ok(()) => self.log.push(Event::Released {
                client: self.id,
                key: key.to_owned(),
            }),
            Err(err) => self.note(format!("release of {key}: {err}")),
        }
    }

    /// Logs that this program believes it holds the guard's key from now
    /// on, and ends that belief when the guard is lost or released. The
    /// returned future completes once the end is logged.
    fn believe(&self, guard: &LockGuard) -> impl Future<Output = ()> + 'static {
        let asked = Duration::from_millis(self.ttl_ms.load(std::sync::atomic::Ordering::Relaxed));
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
        let (log, client, guard) = (self.log.clone(), self.id, guard.clone());
        let (done, ended) = tokio::sync::oneshot::channel();
        tokio::task::spawn_local(async move {
            guard.lost().await;
            if !guard.is_lost() {
                log.push(Event::Contract {
                    client,
                    what: format!("lost() resolved on {key} while is_lost() is false"),
                });
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
    async fn work(&self, guards: &[&LockGuard], work: Duration) {
        let end = tokio::time::Instant::now() + work;
        let any_lost = || guards.iter().any(|g| g.is_lost());
        while tokio::time::Instant::now() < end && !any_lost() {
            for guard in guards {
                let lease = guard.lease();
                self.keeps_its_word(guard, lease.key()).await;
                let remaining = guard.remaining();
                let accepted = self.gate.write(lease.key(), lease.fencing_token());
                self.log.push(Event::Wrote {
                    client: self.id,
                    key: lease.key().to_owned(),
                    fence: lease.fencing_token(),
                    accepted,
                    remaining,
                });
            }
            let lost = guards.iter().map(|g| Box::pin(g.lost()));
            tokio::select! {
                biased;
                _ = futures_any(lost) => {}
                () = tokio::time::sleep(Duration::from_millis(700)) => {}
            }
        }
    }

    /// A held set has a guard for every key asked for.
    fn whole_set(&self, guards: usize, asked: usize) {
        if guards != asked {
            self.log.push(Event::Contract {
                client: self.id,
                what: format!("a held set lists {guards} keys with guards; {asked} were asked for"),
            });
        }
    }

    /// What a guard says about itself agrees with itself: its key, and
    /// `is_lost()`, `wait_lost(0)` and `failure()`.
    async fn keeps_its_word(&self, guard: &LockGuard, key: &str) {
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
        for what in broken {
            self.log.push(Event::Contract {
                client: self.id,
                what,
            });
        }
    }

    /// Works under a held lock, then releases it, or (a third of the time)
    /// drops it to the background release; at times it gives up the lock
    /// first (`mark_lost`), which must end the belief as `Marked`.
    async fn use_held(&self, held: volcano::HeldLock, work: Duration, coin: u64) {
        let ended = self.believe(&held);
        self.work(&[&*held], work).await;
        if coin % 11 == 0 {
            held.mark_lost("the program gave up");
            let marked = held.failure().map(|lost| lost.reason());
            if !held.is_lost() || marked.is_none() {
                self.log.push(Event::Contract {
                    client: self.id,
                    what: format!(
                        "after mark_lost, is_lost() is {} and failure() {marked:?}",
                        held.is_lost()
                    ),
                });
            }
        }
        if coin % 3 == 0 {
            drop(held);
        } else {
            let key = held.key().to_owned();
            self.released(&key, held.release().await);
        }
        ended.await;
    }

    /// `hold` with options the coin picks: a cap on the hold (`max_hold`)
    /// and a per-request timeout.
    async fn shaped_hold(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        coin: u64,
    ) -> volcano::Result<volcano::HeldLock> {
        let mut hold = self
            .locks
            .hold(key, ttl)
            .wait(wait)
            .poll_interval(poll_for(coin));
        if coin % 5 == 0 {
            hold = hold.max_hold(Duration::from_millis(1_000 + coin % 9_000));
        }
        if coin % 7 == 0 {
            hold = hold.timeout(Duration::from_millis(500 + coin % 4_000));
        }
        hold.await
    }

    /// Frees whatever lease `token` may hold on `key` (release is
    /// idempotent), trying again while the failure is transient.
    async fn release_own(&self, key: &str, token: String) {
        let orphan = volcano::LockLease::new(key, token, chrono::DateTime::UNIX_EPOCH, 0);
        for _ in 0..4 {
            match self.locks.release(&orphan).await {
                Err(err) if err.is_transient() => {
                    self.note(format!("release {key} of own token failed, again: {err}"));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(err) => {
                    self.kept(key, None);
                    return self.note(format!("release {key} of own token: {err}"));
                }
                Ok(()) => return self.released(key, Ok(())),
            }
        }
        self.kept(key, None);
    }

    /// A release this program sent by hand did not free `key` (the lease
    /// with `fence`, when known).
    fn kept(&self, key: &str, fence: Option<i64>) {
        self.log.push(Event::Kept {
            client: self.id,
            key: key.to_owned(),
            fence,
        });
    }

    /// Every key at once, then released (or dropped).
    async fn hold_all(
        &self,
        all: &[String],
        ttl: Duration,
        wait: Duration,
        work: Duration,
        coin: u64,
    ) {
        let mut hold = self
            .locks
            .hold_all(all.to_vec(), ttl)
            .wait(wait)
            .poll_interval(poll_for(coin));
        if coin % 4 == 0 {
            hold = hold.max_hold(Duration::from_millis(1_000 + coin % 9_000));
        }
        let held = match hold.await {
            Ok(held) => held,
            Err(err) => return self.note(format!("hold_all: {err}")),
        };
        let set = held.set();
        let guards: Vec<LockGuard> = set.keys().filter_map(|k| set.guard(k)).cloned().collect();
        self.whole_set(guards.len(), all.len());
        let ended: Vec<_> = guards.iter().map(|g| self.believe(g)).collect();
        self.work(&guards.iter().collect::<Vec<_>>(), work).await;
        if coin % 3 == 0 {
            drop(held);
        } else if let Err(err) = held.release().await {
            self.note(format!("release of all: {err}"));
        }
        futures_all(ended).await;
    }

    /// A hold under the program's own token, released or dropped. A
    /// failure, or the program dropping it (see [`Ctx::recover_own`]), is
    /// recovered the documented way: hold again with the same token
    /// (idempotent: it gets back the lease if it is still ours), then
    /// release.
    async fn own_token(&self, key: &str, ttl: Duration, wait: Duration, work: Duration, coin: u64) {
        let token = uuid_from(coin);
        let hold = self.locks.hold(key, ttl).token(token.clone()).wait(wait);
        match hold.poll_interval(poll_for(coin)).await {
            Ok(held) => self.use_held(held, work, coin).await,
            Err(err) => {
                self.note(format!("hold {key} with own token: {err}"));
                self.recover_own(key, token, ttl).await;
            }
        }
    }

    /// After an abandoned or failed hold under `token`: holds again with
    /// it, without waiting, works a little if that got the lease back,
    /// and releases whatever the token may hold.
    async fn recover_own(&self, key: &str, token: String, ttl: Duration) {
        match self.locks.hold(key, ttl).token(token.clone()).await {
            Ok(held) => {
                let ended = self.believe(&held);
                self.work(&[&*held], Duration::from_secs(1)).await;
                self.released(key, held.release().await);
                ended.await;
            }
            Err(err) => self.note(format!("recovering {key} with own token: {err}")),
        }
        self.release_own(key, token).await;
    }

    /// A waiting acquire, a renew and a release, by hand.
    async fn plain(&self, key: &str, ttl: Duration, wait: Duration, coin: u64) {
        let locks = &self.locks;
        let acquire = locks.acquire(key, ttl).wait(wait);
        let lease = match acquire.poll_interval(poll_for(coin)).await {
            Ok(lease) => lease,
            Err(err) => return self.note(format!("acquire {key}: {err}")),
        };
        self.log.push(Event::Leased {
            client: self.id,
            key: key.to_owned(),
            fence: lease.fencing_token(),
        });
        tokio::time::sleep(ttl / 4).await;
        let lease = match locks.renew(&lease, ttl).await {
            Ok(renewed) => renewed,
            Err(err) => {
                self.note(format!("renew {key}: {err}"));
                lease
            }
        };
        let released = locks.release(&lease).await;
        if released.is_err() {
            self.kept(key, Some(lease.fencing_token()));
        }
        self.released(key, released);
    }

    /// Leader election for a while: each term writes through the gate.
    async fn lead(&self, key: &str, ttl: Duration, work: Duration) {
        let until = tokio::time::sleep(work * 3);
        let result = self
            .locks
            .leader(key, ttl)
            .until(until)
            .run(|term| async move {
                let ended = self.believe(&term);
                self.work(&[&term], Duration::from_secs(3600)).await;
                ended.await;
                Ok::<_, volcano::Error>(())
            })
            .await;
        if let Err(err) = result {
            self.note(format!("leader {key}: {err}"));
        }
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

/// How often a waiter looks for an early release: mostly the default, at
/// times much more often (so that a waiter can take a key in the moment
/// between a release that was applied and its client learning so).
fn poll_for(coin: u64) -> Duration {
    const OFTEN: [u64; 4] = [200, 500, 1_000, 2_000];
    match (coin / 11) % 3 {
        0 => Duration::from_millis(OFTEN[(coin / 33 % 4) as usize]),
        _ => Duration::from_secs(10),
    }
}

/// A UUID spelled from `seed` (a caller's own token).
fn uuid_from(seed: u64) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    let (a, b, c, d): (u32, u16, u16, u64) =
        (rng.random(), rng.random(), rng.random(), rng.random());
    format!(
        "{a:08x}-{b:04x}-4{:03x}-8{:03x}-{:012x}",
        c & 0x0fff,
        d & 0x0fff,
        (d >> 16) & 0xffff_ffff_ffff
    )
}

/// Waits for every future.
async fn futures_all(all: Vec<impl Future<Output = ()>>) {
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
