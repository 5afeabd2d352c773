//! The volcano SDK and the mock server's lock logic under a deterministic
//! simulation: one server host and a few client hosts on turmoil's
//! simulated network and clock, every choice drawn from one seed, so that
//! a seed replays exactly. Client hosts run seeded programs of real SDK
//! calls (`program.rs`); the driver here injects faults from the same seed;
//! `check.rs` judges the run. See DESIGN.md section 13.

mod check;
mod driver;
mod log;
mod net;
mod program;
mod watchdog;
mod world;

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

pub use volcano::sim::Sabotage;

use crate::driver::Driver;
use crate::log::Event;
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
    /// Which capability the programs drive in depth, beyond the mix.
    pub depth: Depth,
}

/// A capability driven in depth: the default mix reaches its corners
/// about once a seed, or never.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Depth {
    /// The default mix of operations.
    #[default]
    Mix,
    /// Kept minimums in depth: most holds keep a minimum (1 s to 19 s),
    /// end the moment a renewal goes out (held on its way, applied late)
    /// and have their fix-up troubled (`release/late.rs`, `Kept`).
    KeptMinimums,
    /// Observers in depth: the first program only observes, for 30 s to
    /// 70 s each time, the slower observers every 20 s; the others hold,
    /// renew, let lapse and take over the keys (leases of 5 s to 12 s,
    /// work of up to 32 s), twice the steps; one fault every six seconds,
    /// not two, for undisturbed stretches.
    Observers,
    /// Semaphores in depth: every scope takes a permit, and one program
    /// in each run tries more one-off semaphores than a client remembers
    /// (`semaphore/memory.rs`): what it keeps stays bounded, the most
    /// recently used kept.
    Permits,
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
            depth: Depth::Mix,
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
    /// For every loss a guard found itself, the server's expiry of that
    /// lease minus the moment the guard said it was lost, in
    /// milliseconds (see `check/margin.rs`).
    pub margins_ms: Vec<i64>,
    /// Late tries beyond the bound: grants no program learned of, made by
    /// a try applied later than its attempt's `sent + timeout + 2 s`, and
    /// not released after; the leak checks excuse them by name.
    pub late_beyond_bound: usize,
    /// Grants no program learned of, made by a try applied after an
    /// attempt of the same acquire had been answered 409 (a retry
    /// answered 409 while its first attempt was on its way).
    pub granted_after_a_409: usize,
}

/// The simulation's time step.
const TICK: Duration = Duration::from_millis(20);
/// After the programs end: long enough for a request still held in the
/// network or behind a gateway to land and be journaled (a delay of up
/// to 15 s, then a gateway's application up to 15 s after that).
const SETTLE: Duration = Duration::from_secs(31);
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
    let mut driver = Driver::new(seed, &world, clocks, options);
    let mut violations = Vec::new();
    let watchdog = watchdog::Watchdog::start(seed);
    // Until every program has shut down or crashed, then long enough for
    // the leases of a crashed one to expire.
    while (0..options.clients).any(|c| !world.log.finished(c) && !driver.crashed.contains(&c)) {
        driver.tick(&mut sim);
        if let Err(err) = watchdog.step(sim.elapsed(), || sim.step()) {
            violations.push(format!("a host failed: {err}"));
            break;
        }
    }
    let end = sim.elapsed();
    // The leases when the programs ended, before any could expire: what
    // the end-of-run check judges.
    let at_end = world.leases(end, jumped(&world.log.events()));
    while sim.elapsed() < end + SETTLE {
        if let Err(err) = watchdog.step(sim.elapsed(), || sim.step()) {
            violations.push(format!("a host failed while settling: {err}"));
            break;
        }
    }
    drop(watchdog);
    let events = world.log.events();
    // The programs' own faults: futures dropped mid-operation, force-releases.
    for e in &events {
        let kind = match &e.event {
            Event::Note { what, .. } if what == "dropped an operation" => "dropped-future",
            Event::Forced { .. } => "force-release",
            Event::Fault { what } if what.starts_with("late-renewal-at-job-end") => {
                "late-renewal-at-job-end"
            }
            Event::Fault { what } if what.starts_with("quota-spent-beside") => "quota-spent-beside",
            Event::Fault { what } if what.starts_with("fix-up-troubled") => "fix-up-troubled",
            Event::Fault { what } if what.starts_with("acquire-applied-late") => {
                "acquire-applied-late"
            }
            _ => continue,
        };
        *driver.kinds.entry(kind.to_owned()).or_default() += 1;
    }
    let mut margins_ms = Vec::new();
    let mut late = check::Late::default();
    match at_end.and_then(|at_end| world.server_view(at_end)) {
        Some(server) => {
            let found = check::all(&events, &server, end, options.clock_rate);
            violations.extend(found.violations);
            margins_ms = found.margins_ms;
            late = found.late;
        }
        None => violations.push("the server never started".to_owned()),
    }
    let mut trace = log::trace(&events);
    trace.push_str(&world.journal_trace());
    trace.push_str(&format!(
        "late tries beyond the bound: {}; grants after a 409 to their acquire: {}\n",
        late.beyond_bound, late.after_a_409
    ));
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
        margins_ms,
        late_beyond_bound: late.beyond_bound,
        granted_after_a_409: late.after_a_409,
    }
}

/// How far the server's clock has jumped, by the log's `events`.
fn jumped(events: &[log::Stamped]) -> Duration {
    events
        .iter()
        .filter_map(|e| match e.event {
            Event::ServerJump { by } => Some(by),
            _ => None,
        })
        .sum()
}

pub(crate) fn client_name(id: usize) -> String {
    format!("client-{id}")
}
