//! The volcano SDK and the mock server's lock logic under a deterministic
//! simulation: one server host and a few client hosts on turmoil's
//! simulated network and clock, every choice drawn from one seed, so that
//! a seed replays exactly. Client hosts run seeded programs of real SDK
//! calls (`program.rs`); the driver here injects faults from the same seed;
//! `check.rs` judges the run. See DESIGN.md section 13.

mod check;
mod log;
mod net;
mod program;
mod world;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
pub use volcano::sim::Sabotage;
use volcano_mock_server::{Fault, MockServer, Operation};

use crate::log::{Event, Log};
use crate::net::SERVER;
use crate::world::{World, EPOCH_SECS};

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Options {
    /// Client hosts, each with one program.
    pub clients: usize,
    /// Lock keys the programs share.
    pub keys: usize,
    /// Operations per program.
    pub steps: usize,
    /// Faults are injected during this much simulated time from the start;
    /// then every link is repaired so that the programs can finish.
    pub fault_window: Duration,
    /// A bug planted in the SDK, to show that the checks find it.
    pub sabotage: Sabotage,
    /// The rate every client host's clock runs at against true time
    /// (`Some(0.96)`: 4 % slow); `None`: exactly.
    pub clock_rate: Option<f64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            clients: 3,
            keys: 2,
            steps: 6,
            fault_window: Duration::from_secs(90),
            sabotage: Sabotage::None,
            clock_rate: None,
        }
    }
}

/// What one seed did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// Every check that failed, one line each.
    pub violations: Vec<String>,
    /// Faults injected.
    pub faults: usize,
    /// Faults injected, by kind.
    pub fault_kinds: BTreeMap<String, usize>,
    /// Events logged.
    pub events: usize,
    /// The event trace: the same seed gives the same bytes.
    pub trace: String,
}

/// The simulation's time step.
const TICK: Duration = Duration::from_millis(20);
/// After the programs end: long enough for a crashed program's leases
/// (ttl at most 12 s, + 1 s grace) to expire.
const SETTLE: Duration = Duration::from_secs(15);
/// No run lasts longer than this in simulated time.
const LIMIT: Duration = Duration::from_secs(3600);

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs one seed and checks it.
pub fn run(seed: u64, options: &Options) -> Outcome {
    volcano::sim::enter(Some(seed));
    volcano::sim::sabotage(options.sabotage);
    let outcome = simulate(seed, options);
    volcano::sim::sabotage(Sabotage::None);
    volcano::sim::enter(None);
    outcome
}

fn simulate(seed: u64, options: &Options) -> Outcome {
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(TICK)
        .simulation_duration(LIMIT)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(40))
        .epoch(SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_SECS as u64))
        .build();
    let world = World::default();
    world.serve(&mut sim);
    let clocks = world.programs(&mut sim, seed, options);
    let mut driver = Driver {
        rng: StdRng::seed_from_u64(seed ^ 0x5eed_f417),
        log: world.log.clone(),
        server: world.server.clone(),
        clocks,
        options: options.clone(),
        kinds: BTreeMap::new(),
        repairs: Vec::new(),
        crashed: Vec::new(),
    };
    let mut violations = Vec::new();
    // Until every program has shut down or crashed, then long enough for
    // the leases of a crashed one to expire.
    while (0..options.clients).any(|c| !world.log.finished(c) && !driver.crashed.contains(&c)) {
        driver.tick(&mut sim);
        if let Err(err) = sim.step() {
            violations.push(format!("a host failed: {err}"));
            break;
        }
    }
    let end = sim.elapsed();
    while sim.elapsed() < end + SETTLE {
        if let Err(err) = sim.step() {
            violations.push(format!("a host failed while settling: {err}"));
            break;
        }
    }
    let events = world.log.events();
    // The programs' own faults: futures dropped mid-operation, force-releases.
    for e in &events {
        let kind = match &e.event {
            Event::Note { what, .. } if what == "dropped an operation" => "dropped-future",
            Event::Forced { .. } => "force-release",
            _ => continue,
        };
        *driver.kinds.entry(kind.to_owned()).or_default() += 1;
    }
    let jumped = events
        .iter()
        .filter_map(|e| match e.event {
            Event::ServerJump { by } => Some(by),
            _ => None,
        })
        .sum();
    match world.server_view(sim.elapsed(), jumped) {
        Some(server) => violations.extend(check::all(&events, &server, end, options.clock_rate)),
        None => violations.push("the server never started".to_owned()),
    }
    let mut trace = log::trace(&events);
    trace.push_str(&world.journal_trace());
    for v in &violations {
        trace.push_str("violation: ");
        trace.push_str(v);
        trace.push('\n');
    }
    Outcome {
        seed,
        violations,
        faults: driver.kinds.values().sum(),
        fault_kinds: driver.kinds,
        events: events.len(),
        trace,
    }
}

pub(crate) fn client_name(id: usize) -> String {
    format!("client-{id}")
}

/// Injects faults from the seed while the window is open, and undoes the
/// network ones when their time is up.
struct Driver {
    rng: StdRng,
    log: Log,
    server: Arc<Mutex<Option<MockServer>>>,
    clocks: Vec<Arc<Mutex<Option<volcano::LeaseClock>>>>,
    options: Options,
    /// Faults injected, by kind.
    kinds: BTreeMap<String, usize>,
    /// Links to repair or release: when, which client, and whether it was
    /// a hold (released) rather than a partition (repaired).
    repairs: Vec<(Duration, usize, bool)>,
    crashed: Vec<usize>,
}

impl Driver {
    fn tick(&mut self, sim: &mut turmoil::Sim<'_>) {
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
        // About one fault every two seconds of simulated time.
        if !open || !self.rng.random_bool(TICK.as_secs_f64() / 2.0) {
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
                sim.crash(name.as_str());
                self.crashed.push(client);
                self.log.push_at(now, Event::Crashed { client });
                format!("crash of {name}")
            }
            _ => {
                let latency = Duration::from_millis(self.rng.random_range(1..2_000));
                sim.set_link_latency(name.as_str(), SERVER, latency);
                format!("latency of {latency:?} between {name} and the server")
            }
        };
        Some(what)
    }

    /// A fault of the server's own: an answer status, a dropped answer, a
    /// held answer, a reset.
    fn server_fault(&mut self, lasting: Duration) -> String {
        let ops = [
            Operation::Acquire,
            Operation::Renew,
            Operation::Release,
            Operation::Get,
        ];
        let mut op = ops[self.rng.random_range(0..ops.len())];
        let times = self.rng.random_range(1..=3);
        let (fault, kind) = match self.rng.random_range(0..6) {
            // A release refused for good (a rotated or revoked key): the
            // lease stays until its ttl, and `shutdown` must say so.
            5 => {
                op = Operation::Release;
                let status = if self.rng.random_bool(0.5) { 401 } else { 403 };
                (Fault::status(status), format!("refused-release {status}"))
            }
            0 => (Fault::status(503), "503".to_owned()),
            1 => (Fault::status(429), "429".to_owned()),
            2 => (Fault::drop_response(), "drop-response".to_owned()),
            3 => (
                Fault::delay_response(lasting),
                format!("delay-response of {lasting:?}"),
            ),
            _ => (Fault::reset(), "reset".to_owned()),
        };
        let what = format!("{kind} on {op:?} x{times}");
        if let Some(mock) = lock(&self.server).as_ref() {
            mock.inject(fault.on(op).times(times));
        }
        what
    }
}
