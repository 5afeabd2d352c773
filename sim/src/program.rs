//! What a client host runs: a seeded program of lock operations through
//! the real SDK (hold, with_lock, try_with_lock, a waiting acquire with
//! renew and release, leader, force-release), some futures dropped at a
//! random point, then `shutdown`. Every belief that it holds a key is
//! logged with the guard's fence, and ended when the guard says it is lost
//! or released.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use volcano::{Client, LockGuard, Locks};

use crate::log::{Event, Log};
use crate::net::{SimNetwork, PORT, SERVER};

/// The service key of the simulated server.
pub(crate) const SERVICE_KEY: &str = "sim-service-key";
/// Each request's timeout.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A store guarded by fences: a write is accepted when its fence is not
/// lower than the highest the key has seen (the rule a fenced store keeps).
#[derive(Clone, Default)]
pub(crate) struct Gate(Arc<Mutex<HashMap<String, i64>>>);

impl Gate {
    fn write(&self, key: &str, fence: i64) -> bool {
        let mut highest = crate::lock(&self.0);
        let seen = highest.entry(key.to_owned()).or_insert(i64::MIN);
        if fence < *seen {
            return false;
        }
        *seen = fence;
        true
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
        let network = SimNetwork {
            client: self.id,
            timeout: TIMEOUT,
            senders: self.senders.clone(),
        };
        let client = volcano::sim::client(builder, network)?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let ctx = Ctx {
            id: self.id,
            locks: client.locks(),
            log: self.log.clone(),
            gate: self.gate.clone(),
        };
        for _ in 0..self.steps {
            let key = self.keys[rng.random_range(0..self.keys.len())].clone();
            let ttl = Duration::from_secs(rng.random_range(5..=12));
            let op = rng.random_range(0..12);
            let work = Duration::from_millis(rng.random_range(0..8_000));
            // Some operations are abandoned at a random point.
            let drop_after = rng
                .random_bool(0.2)
                .then(|| Duration::from_millis(rng.random_range(0..6_000)));
            let coin: u64 = rng.random();
            // How long this operation waits for a held key, if it does.
            let waits = match op {
                0..=5 | 8 | 9 => Some(Duration::from_millis(coin % 20_000)),
                10 => Some(work * 3),
                _ => None,
            };
            if let Some(wait) = waits {
                let until = turmoil::sim_elapsed().unwrap_or_default() + wait;
                self.log.push(Event::Waits {
                    client: self.id,
                    key: key.clone(),
                    until,
                });
            }
            let step = ctx.step(op, key, ttl, work, coin);
            match drop_after {
                Some(after) => {
                    tokio::select! {
                        () = step => {}
                        () = tokio::time::sleep(after) => ctx.note("dropped an operation"),
                    }
                }
                None => step.await,
            }
            self.log.push(Event::StepEnded { client: self.id });
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..2_000))).await;
        }
        let mut unreleased = client.shutdown(Duration::from_secs(120)).await;
        unreleased.sort();
        self.log.push(Event::Done {
            client: self.id,
            unreleased,
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
}

impl Ctx {
    fn note(&self, what: impl Into<String>) {
        self.log.push(Event::Note {
            client: self.id,
            what: what.into(),
        });
    }

    /// One operation; `op` picks which.
    async fn step(&self, op: u32, key: String, ttl: Duration, work: Duration, coin: u64) {
        let wait = Duration::from_millis(coin % 20_000);
        let locks = &self.locks;
        match op {
            0..=2 => match locks.hold(&key, ttl).wait(wait).await {
                Ok(held) => {
                    let ended = self.believe(&held);
                    self.work(&held, work).await;
                    if coin % 3 == 0 {
                        drop(held);
                    } else if let Err(err) = held.release().await {
                        self.note(format!("release of {key}: {err}"));
                    }
                    ended.await;
                }
                Err(err) => self.note(format!("hold {key}: {err}")),
            },
            3..=5 => {
                let scope = locks.with_lock(&key, ttl, |guard| async move {
                    let ended = self.believe(&guard);
                    self.work(&guard, work).await;
                    Ok::<_, volcano::Error>(ended)
                });
                match scope.wait(wait).await {
                    Ok(ended) => ended.await,
                    Err(err) => self.note(format!("with_lock {key}: {err}")),
                }
            }
            6 | 7 => {
                let scope = locks.try_with_lock(&key, ttl, |guard| async move {
                    let ended = self.believe(&guard);
                    self.work(&guard, work).await;
                    Ok::<_, volcano::Error>(ended)
                });
                match scope.await {
                    Ok(Some(ended)) => ended.await,
                    Ok(None) => self.note(format!("try_with_lock {key}: held elsewhere")),
                    Err(err) => self.note(format!("try_with_lock {key}: {err}")),
                }
            }
            8 | 9 => self.plain(&key, ttl, wait).await,
            10 => self.lead(&key, ttl, work).await,
            _ => match locks.force_release(&key).await {
                Ok(()) => self.log.push(Event::Forced {
                    client: self.id,
                    key,
                }),
                Err(err) => self.note(format!("force_release {key}: {err}")),
            },
        }
    }

    /// Logs that this program believes it holds the guard's key from now
    /// on, and ends that belief when the guard is lost or released. The
    /// returned future completes once the end is logged.
    fn believe(&self, guard: &LockGuard) -> impl Future<Output = ()> + 'static {
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

    /// The protected work: writes through the gate, each while the guard
    /// still holds, until `work` has passed or the guard is lost.
    async fn work(&self, guard: &LockGuard, work: Duration) {
        let lease = guard.lease();
        let end = tokio::time::Instant::now() + work;
        while tokio::time::Instant::now() < end && !guard.is_lost() {
            let accepted = self.gate.write(lease.key(), lease.fencing_token());
            self.log.push(Event::Wrote {
                client: self.id,
                key: lease.key().to_owned(),
                fence: lease.fencing_token(),
                accepted,
            });
            tokio::select! {
                () = guard.lost() => {}
                () = tokio::time::sleep(Duration::from_millis(700)) => {}
            }
        }
    }

    /// A waiting acquire, a renew and a release, by hand.
    async fn plain(&self, key: &str, ttl: Duration, wait: Duration) {
        let locks = &self.locks;
        let lease = match locks.acquire(key, ttl).wait(wait).await {
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
        if let Err(err) = locks.release(&lease).await {
            self.note(format!("release {key}: {err}"));
        }
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
                self.work(&term, Duration::from_secs(3600)).await;
                ended.await;
                Ok::<_, volcano::Error>(())
            })
            .await;
        if let Err(err) = result {
            self.note(format!("leader {key}: {err}"));
        }
    }
}
