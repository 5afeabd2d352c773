//! Catches a paused runtime clock. Guards and requests sleep on the
//! runtime's clock (`tokio::time`) but measure leases on real clocks. When a
//! test pauses tokio's clock (`#[tokio::test(start_paused = true)]`,
//! `tokio::time::pause()`), tokio jumps it ahead whenever the runtime waits:
//! request timeouts fire at once, and a guard's sleep ends before any real
//! time has passed. Left alone that is a busy loop that looks like a hang;
//! these checks turn it into a message instead.

use std::time::Duration;

/// How far the runtime's clock may run ahead of the real one before it
/// counts as paused and advanced (it never runs ahead otherwise: unpaused,
/// both read the same monotonic clock).
const TOLERANCE: Duration = Duration::from_millis(20);

/// What went wrong, for the error or the loss it causes.
pub(crate) const PAUSED_CLOCK: &str =
    "tokio's clock is paused (#[tokio::test(start_paused = true)] \
     or tokio::time::pause()) and jumped ahead of real time: lock calls and guards need real time. \
     Leave tokio's clock running; move lease time with volcano::LeaseClock::adjustable() and the \
     mock server's time with MockServer::advance() (the volcano::mock page says how)";

/// Two readings taken together: the runtime's clock and the real one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch {
    runtime: tokio::time::Instant,
    real: std::time::Instant,
}

impl Stopwatch {
    pub(crate) fn start() -> Self {
        // Real first here and last below: the runtime's interval lies
        // inside the real one, so a running clock can never seem ahead.
        let real = std::time::Instant::now();
        Stopwatch {
            runtime: tokio::time::Instant::now(),
            real,
        }
    }

    /// True when the runtime's clock moved further than real time since
    /// `start`: it is paused and was advanced.
    pub(crate) fn runtime_ran_ahead(&self) -> bool {
        if simulated() {
            return false;
        }
        let runtime = self.runtime.elapsed();
        runtime > self.real.elapsed().saturating_add(TOLERANCE)
    }
}

thread_local! {
    /// This thread runs a simulation, whose runtime clock is the only
    /// clock and runs ahead of real time by design.
    static SIMULATED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn simulated() -> bool {
    SIMULATED.get()
}

/// Marks this thread as running a simulation (feature `sim`).
#[cfg(feature = "sim")]
pub(crate) fn simulate(on: bool) {
    SIMULATED.set(on);
}
