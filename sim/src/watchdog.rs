//! A step of the simulation that never returns: some task runs in a loop
//! that never waits (a renewal that retries at once forever, say). The
//! simulated clock cannot move while it runs, so nothing else in the run
//! happens and nothing can be judged; the seed would hang its test. The
//! watchdog, on a thread of its own, reports the seed and ends the
//! process instead: a hang is a failing seed. A step (20 ms of simulated
//! time) normally takes microseconds, a few milliseconds at most.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::lock;

/// Real time a step may take before it is taken to hang: far above any
/// step's, in a debug build on a busy machine too.
const BUDGET: Duration = Duration::from_secs(10);
/// How often the watchdog looks.
const LOOK_EVERY: Duration = Duration::from_millis(200);
/// The process's exit status when a step hangs (a test's panic's).
const HUNG: i32 = 101;

#[derive(Default)]
struct Shared {
    /// When the step running now began, and at what simulated time.
    step: Mutex<Option<(Instant, Duration)>>,
    done: AtomicBool,
}

/// Watches the steps of one seed's run; stops watching when dropped.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    pub(crate) fn start(seed: u64) -> Self {
        let shared = Arc::new(Shared::default());
        let watched = Arc::clone(&shared);
        let thread = std::thread::spawn(move || {
            while !watched.done.load(Ordering::Acquire) {
                std::thread::park_timeout(LOOK_EVERY);
                let step = *lock(&watched.step);
                if let Some((began, at)) = step.filter(|(began, _)| began.elapsed() > BUDGET) {
                    eprintln!(
                        "seed {seed}: the simulation's step at {at:?} ran {:?} of real time \
                         without returning: a task loops without ever waiting\n  replay: cargo \
                         run --release -- --seed {seed} (from sim/)",
                        began.elapsed()
                    );
                    std::process::exit(HUNG);
                }
            }
        });
        Watchdog {
            shared,
            thread: Some(thread),
        }
    }

    /// Runs one step (at simulated time `at`) under watch.
    pub(crate) fn step<T>(&self, at: Duration, step: impl FnOnce() -> T) -> T {
        *lock(&self.shared.step) = Some((Instant::now(), at));
        let out = step();
        *lock(&self.shared.step) = None;
        out
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.done.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
