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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
pub use volcano::sim::Sabotage;
use volcano_mock_server::{Fault, MockServer, Operation};

use crate::log::{Event, Log};
use crate::net::{PORT, SERVER};
use crate::program::{Gate, Program, SERVICE_KEY};

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
}

impl Default for Options {
    fn default() -> Self {
        Options {
            clients: 3,
            keys: 2,
            steps: 6,
            fault_window: Duration::from_secs(90),
            sabotage: Sabotage::None,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
    let epoch: DateTime<Utc> = DateTime::from_timestamp(1_780_000_000, 0).unwrap_or_default();
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(TICK)
        .simulation_duration(LIMIT)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(40))
        .epoch(SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000))
        .build();
    let log = Log::default();
    let server: Arc<Mutex<Option<MockServer>>> = Arc::default();
    let started: Arc<Mutex<Duration>> = Arc::default();
    {
        let (server, started) = (server.clone(), started.clone());
        sim.host(SERVER, move || {
            let (server, started) = (server.clone(), started.clone());
            async move {
                let addr = std::net::SocketAddr::from(([0, 0, 0, 0], PORT));
                let mock = MockServer::builder()
                    .service_key(SERVICE_KEY)
                    .rate_limit(600)
                    .start_detached(addr, epoch)?;
                *lock(&started) = turmoil::sim_elapsed().unwrap_or_default();
                *lock(&server) = Some(mock);
                let listener = turmoil::net::TcpListener::bind(addr).await?;
                loop {
                    let (stream, _) = listener.accept().await?;
                    let connection = lock(&server).as_ref().map(|m| m.serve_connection(stream));
                    if let Some(connection) = connection {
                        tokio::spawn(connection);
                    }
                }
            }
        });
    }
    let gate = Gate::default();
    let senders = crate::net::Senders::default();
    let keys: Vec<String> = (0..options.keys).map(|k| format!("key-{k}")).collect();
    let mut clocks = Vec::new();
    for id in 0..options.clients {
        let clock = Arc::default();
        clocks.push(Arc::clone(&clock));
        let program = Program {
            id,
            seed: seed.wrapping_mul(1_000_003).wrapping_add(id as u64),
            keys: keys.clone(),
            steps: options.steps,
            log: log.clone(),
            gate: gate.clone(),
            senders: senders.clone(),
            clock,
        };
        // A host rather than a turmoil client, so that it can crash.
        let program = std::cell::RefCell::new(Some(program));
        sim.host(client_name(id), move || {
            let program = program.borrow_mut().take();
            async move {
                match program {
                    Some(program) => program.run().await,
                    None => Ok(()),
                }
            }
        });
    }
    let mut driver = Driver {
        rng: StdRng::seed_from_u64(seed ^ 0x5eed_f417),
        log: log.clone(),
        server: server.clone(),
        clocks,
        options: options.clone(),
        faults: 0,
        repairs: Vec::new(),
        crashed: Vec::new(),
    };
    let mut violations = Vec::new();
    // Until every program has shut down or crashed.
    while (0..options.clients).any(|c| !log.finished(c) && !driver.crashed.contains(&c)) {
        driver.tick(&mut sim);
        if let Err(err) = sim.step() {
            violations.push(format!("a host failed: {err}"));
            break;
        }
    }
    let end = sim.elapsed();
    let settle_until = end + SETTLE;
    while sim.elapsed() < settle_until {
        if let Err(err) = sim.step() {
            violations.push(format!("a host failed while settling: {err}"));
            break;
        }
    }
    let events = log.events();
    let checked = lock(&server).as_ref().map(|mock| check::Server {
        journal: mock.requests(),
        locks_at_end: {
            let mut locks = mock.locks();
            locks.sort_by(|a, b| a.key.cmp(&b.key));
            locks
        },
        epoch,
        started: *lock(&started),
        sent: lock(&senders).clone(),
    });
    match checked {
        Some(server) => violations.extend(check::all(&events, &server, end)),
        None => violations.push("the server never started".to_owned()),
    }
    let mut trace = log::trace(&events);
    if let Some(mock) = lock(&server).as_ref() {
        let senders = lock(&senders);
        for r in mock.requests() {
            let sender = r.request_id.as_ref().and_then(|id| senders.by_id.get(id));
            trace.push_str(&format!(
                "server {} {} {:?} {} status {:?} fence {:?} from client {:?} fault {:?} id {:?}\n",
                r.seq,
                r.at.format("%H:%M:%S%.3f"),
                r.operation,
                r.key,
                r.status,
                r.fencing_token,
                sender,
                r.fault,
                r.request_id
            ));
        }
    }
    for v in &violations {
        trace.push_str("violation: ");
        trace.push_str(v);
        trace.push('\n');
    }
    Outcome {
        seed,
        violations,
        faults: driver.faults,
        events: events.len(),
        trace,
    }
}

fn client_name(id: usize) -> String {
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
    faults: usize,
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
        let name = client_name(client);
        let lasting = Duration::from_millis(self.rng.random_range(100..15_000));
        let what = match self.rng.random_range(0..20) {
            0..=2 => {
                sim.partition(name.as_str(), SERVER);
                self.repairs.push((now + lasting, client, false));
                format!("partition {name} for {lasting:?}")
            }
            3..=5 => {
                sim.hold(name.as_str(), SERVER);
                self.repairs.push((now + lasting, client, true));
                format!("hold {name}'s link for {lasting:?}")
            }
            6..=13 => self.server_fault(lasting),
            14 | 15 => {
                let by = Duration::from_millis(self.rng.random_range(100..20_000));
                if let Some(clock) = lock(&self.clocks[client]).as_ref() {
                    clock.advance(by);
                }
                format!("suspend {name} for {by:?}")
            }
            16 => {
                let by = Duration::from_millis(self.rng.random_range(100..3_000));
                // Only a server that has started can jump.
                let Some(mock) = lock(&self.server).as_ref().map(|m| m.advance(by)) else {
                    return;
                };
                let () = mock;
                self.log.push_at(now, Event::ServerJump { by });
                format!("server clock jumps {by:?}")
            }
            17 if !self.crashed.contains(&client)
                && !self.log.finished(client)
                && self.crashed.len() + 1 < self.options.clients =>
            {
                sim.crash(name.as_str());
                self.crashed.push(client);
                self.log.push_at(now, Event::Crashed { client });
                format!("crash {name}")
            }
            _ => {
                let latency = Duration::from_millis(self.rng.random_range(1..2_000));
                sim.set_link_latency(name.as_str(), SERVER, latency);
                format!("latency {latency:?} between {name} and the server")
            }
        };
        self.faults += 1;
        self.log.push_at(now, Event::Fault { what });
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
        let op = ops[self.rng.random_range(0..ops.len())];
        let times = self.rng.random_range(1..=3);
        let fault = match self.rng.random_range(0..5) {
            0 => Fault::status(503),
            1 => Fault::status(429),
            2 => Fault::drop_response(),
            3 => Fault::delay_response(lasting),
            _ => Fault::reset(),
        };
        let what = format!("{fault:?} on {op:?} x{times}");
        if let Some(mock) = lock(&self.server).as_ref() {
            mock.inject(fault.on(op).times(times));
        }
        what
    }
}
