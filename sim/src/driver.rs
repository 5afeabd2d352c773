//! The driver: injects faults from the seed while the fault window is
//! open (network, server, host and clock faults), undoes the network ones
//! when their time is up, and crashes a holder another program waits for
//! now and then, so that crash recovery has something to judge.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use volcano_mock_server::{Fault, MockServer, Operation};

use crate::log::{Event, Log, Waiting};
use crate::net::SERVER;
use crate::world::World;
use crate::{client_name, lock, Options, TICK};

/// Injects faults from the seed while the window is open, and undoes the
/// network ones when their time is up.
pub(crate) struct Driver {
    rng: StdRng,
    log: Log,
    server: Arc<Mutex<Option<MockServer>>>,
    clocks: Vec<Arc<Mutex<Option<volcano::LeaseClock>>>>,
    options: Options,
    /// Faults injected, by kind.
    pub(crate) kinds: BTreeMap<String, usize>,
    /// Links to repair or release: when, which client, and whether it was
    /// a hold (released) rather than a partition (repaired).
    repairs: Vec<(Duration, usize, bool)>,
    pub(crate) crashed: Vec<usize>,
}

impl Driver {
    /// The driver of the run of `seed`, over `world`'s hosts, with each
    /// client's lease-clock slot (for suspends).
    pub(crate) fn new(
        seed: u64,
        world: &World,
        clocks: Vec<Arc<Mutex<Option<volcano::LeaseClock>>>>,
        options: &Options,
    ) -> Driver {
        Driver {
            rng: StdRng::seed_from_u64(seed ^ 0x5eed_f417),
            log: world.log.clone(),
            server: world.server.clone(),
            clocks,
            options: options.clone(),
            kinds: BTreeMap::new(),
            repairs: Vec::new(),
            crashed: Vec::new(),
        }
    }

    pub(crate) fn tick(&mut self, sim: &mut turmoil::Sim<'_>) {
        let now = sim.elapsed();
        let open = now < self.options.fault_window;
        let due: Vec<_> = self
            .repairs
            .iter()
            .copied()
            .filter(|&(at, ..)| !open || at <= now)
            .collect();
        self.repairs.retain(|&(at, ..)| open && at > now);
        for (_, client, held) in due {
            let name = client_name(client);
            if held {
                sim.release(name.as_str(), SERVER);
            } else {
                sim.repair(name.as_str(), SERVER);
            }
        }
        // About once every 20 s, a holder that another program waits for
        // crashes, if there is one (and a program is left to wait): the
        // moment crash recovery judges, which random crashes rarely hit.
        // Also after the fault window, where the stretch after the crash
        // is left undisturbed.
        if self.rng.random_bool(TICK.as_secs_f64() / 20.0)
            && self.crashed.len() + 1 < self.options.clients
        {
            if let Some(holder) = self.holder_waited_for(now) {
                let what = self.crash(sim, holder, now);
                *self.kinds.entry("crash".to_owned()).or_default() += 1;
                self.log.push_at(now, Event::Fault { what });
            }
        }
        // About one fault every two seconds of simulated time; every six
        // with observers in depth, whose checks judge undisturbed
        // stretches of ten seconds or so.
        let every = if self.options.depth == crate::Depth::Observers {
            6.0
        } else {
            2.0
        };
        if !open || !self.rng.random_bool(TICK.as_secs_f64() / every) {
            return;
        }
        let client = self.rng.random_range(0..self.options.clients);
        if let Some(what) = self.inject(sim, client, now) {
            let kind = what
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            *self.kinds.entry(kind).or_default() += 1;
            self.log.push_at(now, Event::Fault { what });
        }
    }

    /// One fault, chosen from the seed; what it was, or `None` if it could
    /// not be made (a server clock jump before the server started).
    fn inject(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        client: usize,
        now: Duration,
    ) -> Option<String> {
        let name = client_name(client);
        let lasting = Duration::from_millis(self.rng.random_range(100..15_000));
        let what = match self.rng.random_range(0..20) {
            0..=2 => {
                sim.partition(name.as_str(), SERVER);
                self.repairs.push((now + lasting, client, false));
                format!("partition of {name} for {lasting:?}")
            }
            3..=5 => {
                sim.hold(name.as_str(), SERVER);
                self.repairs.push((now + lasting, client, true));
                format!("hold of {name}'s link for {lasting:?}")
            }
            6..=13 => self.server_fault(lasting),
            14 | 15 => {
                let by = Duration::from_millis(self.rng.random_range(100..20_000));
                if let Some(clock) = lock(&self.clocks[client]).as_ref() {
                    clock.advance(by);
                }
                format!("suspend of {name} for {by:?}")
            }
            16 => {
                let by = Duration::from_millis(self.rng.random_range(100..3_000));
                // Only a server that has started can jump.
                lock(&self.server).as_ref().map(|m| m.advance(by))?;
                self.log.push_at(now, Event::ServerJump { by });
                format!("server-clock-jump by {by:?}")
            }
            17 if !self.crashed.contains(&client)
                && !self.log.finished(client)
                && self.crashed.len() + 1 < self.options.clients =>
            {
                self.crash(sim, client, now)
            }
            _ => {
                let latency = Duration::from_millis(self.rng.random_range(1..2_000));
                sim.set_link_latency(name.as_str(), SERVER, latency);
                format!("latency of {latency:?} between {name} and the server")
            }
        };
        Some(what)
    }

    /// Crashes `client`'s host: its leases stay until they expire.
    fn crash(&mut self, sim: &mut turmoil::Sim<'_>, client: usize, now: Duration) -> String {
        let name = client_name(client);
        sim.crash(name.as_str());
        self.crashed.push(client);
        self.log.push_at(now, Event::Crashed { client });
        format!("crash of {name}")
    }

    /// A live program that believes it holds a key another live program
    /// waits for (a waiting acquire or a campaign, with at least 17 s of
    /// its wait left), if any.
    fn holder_waited_for(&self, now: Duration) -> Option<usize> {
        let events = self.log.events();
        let mut holding: BTreeMap<(usize, &str), bool> = BTreeMap::new();
        let mut waiting: BTreeMap<usize, (&str, Duration)> = BTreeMap::new();
        for e in &events {
            match &e.event {
                Event::Believes { client, key, .. } => {
                    holding.insert((*client, key.as_str()), true);
                }
                Event::Ended { client, key, .. } => {
                    holding.insert((*client, key.as_str()), false);
                }
                Event::Waits {
                    client,
                    key,
                    until,
                    how,
                    ..
                } if *how != Waiting::Set => {
                    waiting.insert(*client, (key.as_str(), *until));
                }
                Event::StepEnded { client } | Event::Crashed { client } => {
                    waiting.remove(client);
                }
                _ => {}
            }
        }
        let live = |c: usize| !self.crashed.contains(&c) && !self.log.finished(c);
        holding
            .iter()
            .filter(|&(&(holder, _), &held)| held && live(holder))
            .find(|&(&(holder, key), _)| {
                waiting.iter().any(|(&w, &(k, until))| {
                    w != holder && k == key && live(w) && until > now + Duration::from_secs(17)
                })
            })
            .map(|(&(holder, _), _)| holder)
    }

    /// How long after it arrived a request held on its way (an acquire's
    /// delay) or behind a gateway is applied: nine in ten within 8 s
    /// (inside the window of an attempt with the client's 10 s timeout,
    /// `sent + timeout + LATE_MARGIN`), one in ten from 12.5 s to 14.5 s,
    /// beyond any attempt's window (the checks excuse and count those,
    /// and those beyond a shorter timeout's window).
    fn applied_after(&mut self) -> Duration {
        let ms = if self.rng.random_bool(0.1) {
            self.rng.random_range(12_500..14_500)
        } else {
            self.rng.random_range(0..8_000)
        };
        Duration::from_millis(ms)
    }

    /// The keys a live program believes it holds now.
    fn held_keys(&self) -> Vec<String> {
        let mut holding: BTreeMap<(usize, String), bool> = BTreeMap::new();
        for e in self.log.events() {
            match e.event {
                Event::Believes { client, key, .. } => {
                    holding.insert((client, key), true);
                }
                Event::Ended { client, key, .. } => {
                    holding.insert((client, key), false);
                }
                _ => {}
            }
        }
        let keys: std::collections::BTreeSet<String> = holding
            .into_iter()
            .filter(|((client, _), held)| *held && !self.crashed.contains(client))
            .map(|((_, key), _)| key)
            .collect();
        keys.into_iter().collect()
    }

    /// A fault of the server's own: an answer status, a dropped answer, a
    /// held answer, a reset, a gateway's answer.
    fn server_fault(&mut self, lasting: Duration) -> String {
        let ops = [
            Operation::Acquire,
            Operation::Renew,
            Operation::Release,
            Operation::Get,
            Operation::ForceRelease,
        ];
        let mut op = ops[self.rng.random_range(0..ops.len())];
        let times = self.rng.random_range(1..=3);
        let (fault, kind) = match self.rng.random_range(0..14) {
            // A release, a renewal, an acquire or a look refused for good
            // (a rotated or revoked key; a look also a 400 or 404): a
            // refused release leaves the lease until its ttl, and
            // `shutdown` must say so; a refused renewal loses the lock; a
            // refused acquire ends its wait, a refused look an observer's
            // stream. Half the refused releases aim at a key a program
            // holds, so that its own release is the one refused (the
            // next release of any key is most often an undo's or a
            // background one).
            5 => {
                let mut status = if self.rng.random_bool(0.5) { 401 } else { 403 };
                let (refused, what) = match self.rng.random_range(0..4) {
                    0 => (Operation::Release, "refused-release"),
                    1 => (Operation::Renew, "refused-renewal"),
                    2 => (Operation::Acquire, "refused-acquire"),
                    _ => {
                        status = [400, 401, 403, 404][self.rng.random_range(0..4)];
                        (Operation::Get, "refused-look")
                    }
                };
                op = refused;
                let held = self.held_keys();
                if refused == Operation::Release && !held.is_empty() && self.rng.random_bool(0.5) {
                    let key = held[self.rng.random_range(0..held.len())].clone();
                    let what = format!("{what} {status} of {key}");
                    (Fault::status(status).key(key), what)
                } else {
                    (Fault::status(status), format!("{what} {status}"))
                }
            }
            0 => (Fault::status(503), "503".to_owned()),
            1 => (Fault::status(429), "429".to_owned()),
            2 => (Fault::drop_response(), "drop-response".to_owned()),
            3 => (
                Fault::delay_response(lasting),
                format!("delay-response of {lasting:?}"),
            ),
            // A gateway's or the service's other 5xx: the request may or
            // may not have been applied.
            6 => {
                let status = [500, 502, 504][self.rng.random_range(0..3)];
                (Fault::status(status), status.to_string())
            }
            // The request held on its way, then applied (also when its
            // client has given up meanwhile, and after the release that
            // undoes an acquire: the undo releases again once the try's
            // window has closed).
            7 => {
                let delay = match op {
                    Operation::Acquire | Operation::Renew | Operation::Release => {
                        self.applied_after()
                    }
                    _ => lasting,
                };
                (Fault::delay(delay), format!("delay-request of {delay:?}"))
            }
            // A gateway that gives up on the service: its 5xx after its
            // patience, the request applied on its own time.
            9 => {
                let status = [502, 503, 504][self.rng.random_range(0..3)];
                let patience = Duration::from_millis(self.rng.random_range(100..4_000));
                let applied = self.applied_after();
                (
                    Fault::gateway(status, patience, applied),
                    format!("gateway {status} after {patience:?}, applied after {applied:?}"),
                )
            }
            // An acquire of a key another program holds, answered 503 at
            // once and applied seconds later: its single retry is
            // answered 409 while the first attempt is still on its way,
            // and takes the key if the holder lets go meanwhile. (Twice
            // the weight of the others: a holder rarely lets go in time.)
            10 | 11 => {
                let held = self.held_keys();
                let key = match held.len() {
                    0 => format!("key-{}", self.rng.random_range(0..self.options.keys)),
                    n => held[self.rng.random_range(0..n)].clone(),
                };
                let patience = Duration::from_millis(self.rng.random_range(50..500));
                let applied = Duration::from_millis(self.rng.random_range(2_000..12_000));
                op = Operation::Acquire;
                (
                    Fault::gateway(503, patience, applied).key(key.as_str()),
                    format!(
                        "gateway-behind-holder 503 after {patience:?}, applied after \
                         {applied:?}, of {key}"
                    ),
                )
            }
            // A renewal of a key a program holds, held on its way and
            // applied late: it may land after the job has ended and its
            // lock was released or kept for a minimum (a renewal cannot
            // bring a released lease back; a kept one it would stretch).
            12 | 13 => {
                let held = self.held_keys();
                let key = match held.len() {
                    0 => format!("key-{}", self.rng.random_range(0..self.options.keys)),
                    n => held[self.rng.random_range(0..n)].clone(),
                };
                let applied = self.applied_after();
                op = Operation::Renew;
                (
                    Fault::delay(applied).key(key.as_str()),
                    format!("late-renewal applied after {applied:?}, of {key}"),
                )
            }
            // Applied, and answered with a body the client cannot read
            // (a proxy's page).
            8 => (Fault::garbled_response(), "garbled-response".to_owned()),
            _ => (Fault::reset(), "reset".to_owned()),
        };
        let what = format!("{kind} on {op:?} x{times}");
        if let Some(mock) = lock(&self.server).as_ref() {
            mock.inject(fault.on(op).times(times));
        }
        what
    }
}
