//! The clock behind a scoped lock's local deadline.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
use std::time::Instant;

use tokio::sync::watch;

/// The clock a scoped lock measures its lease deadline with.
///
/// The default, [`LeaseClock::boottime`], keeps counting while the machine
/// is suspended (Linux `CLOCK_BOOTTIME`), so a laptop that sleeps through its
/// lease wakes up knowing the lease is gone. Wall-clock jumps never affect it.
/// Elsewhere it is the monotonic clock, which on some systems (macOS) stops
/// during sleep: there a guard learns of a slept-through lease only when its
/// renewal is refused.
///
/// [`LeaseClock::adjustable`] follows the same time but can be moved
/// forward, to simulate a suspend or a stalled process in tests. Guards on
/// the clock notice a move at once.
///
/// ```
/// use std::time::Duration;
/// let clock = volcano::LeaseClock::adjustable();
/// let before = clock.now();
/// clock.advance(Duration::from_secs(30)); // as if the machine slept 30 s
/// assert!(clock.now() - before >= Duration::from_secs(30));
/// ```
#[derive(Clone)]
pub struct LeaseClock {
    adjust: Option<Arc<Adjust>>,
    /// Reads the runtime's clock from this instant instead of the
    /// machine's boot time (a simulation, whose runtime clock is its time).
    runtime_base: Option<tokio::time::Instant>,
    /// With `runtime_base`: the rate at which this clock runs against the
    /// runtime's (a simulated host's clock drift); `None`: exactly.
    rate: Option<f64>,
}

/// An adjustable clock's offset and the signal that it moved.
struct Adjust {
    offset_ns: AtomicU64,
    moved: watch::Sender<()>,
}

impl LeaseClock {
    /// The suspend-aware clock (`CLOCK_BOOTTIME` on Linux; elsewhere the
    /// monotonic clock).
    pub fn boottime() -> Self {
        LeaseClock {
            adjust: None,
            runtime_base: None,
            rate: None,
        }
    }

    /// The same clock, plus an offset that [`LeaseClock::advance`] moves
    /// forward (never back).
    pub fn adjustable() -> Self {
        LeaseClock {
            adjust: Some(Arc::new(Adjust {
                offset_ns: AtomicU64::new(0),
                moved: watch::Sender::new(()),
            })),
            runtime_base: None,
            rate: None,
        }
    }

    /// Moves an adjustable clock forward; no effect on the default clock.
    /// The offset saturates (at about 584 years) instead of wrapping, so the
    /// clock never goes back.
    pub fn advance(&self, by: Duration) {
        if let Some(adjust) = &self.adjust {
            let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
            let _ = adjust
                .offset_ns
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |o| {
                    Some(o.saturating_add(ns))
                });
            adjust.moved.send_replace(());
        }
    }

    /// The time since an arbitrary fixed origin.
    pub fn now(&self) -> Duration {
        let offset = self
            .adjust
            .as_ref()
            .map_or(0, |a| a.offset_ns.load(Ordering::Relaxed));
        let base = match (self.runtime_base, self.rate) {
            (Some(base), None) => base.elapsed(),
            (Some(base), Some(rate)) => base.elapsed().mul_f64(rate),
            (None, _) => raw_now(),
        };
        base + Duration::from_nanos(offset)
    }

    /// An adjustable clock on the runtime's time (feature `sim`): in a
    /// simulation the runtime's clock is simulated time, and `advance`
    /// plays a suspend. No suspend detector runs for it.
    #[cfg(feature = "sim")]
    pub(crate) fn runtime(rate: Option<f64>) -> Self {
        LeaseClock {
            runtime_base: Some(tokio::time::Instant::now()),
            rate,
            ..Self::adjustable()
        }
    }

    /// A subscription to this clock's jumps: the times it moved further
    /// than the runtime's timers did (a suspend, or [`LeaseClock::advance`]).
    /// Timers sleep on the monotonic clock, which stands still while the
    /// machine is suspended, so a sleeper uses this to wake up on time.
    pub(crate) fn jumps(&self) -> Jumps {
        Jumps {
            suspends: match self.runtime_base {
                Some(_) => None,
                None => suspend::subscribe(),
            },
            moved: self.adjust.as_ref().map(|a| a.moved.subscribe()),
        }
    }
}

/// See [`LeaseClock::jumps`]. Keep one for as long as jumps matter (it
/// keeps the suspend detector running) and [`Jumps::watch`] per sleep.
pub(crate) struct Jumps {
    suspends: Option<watch::Receiver<u64>>,
    moved: Option<watch::Receiver<()>>,
}

impl Jumps {
    /// A subscription that never fires.
    pub(crate) fn none() -> Jumps {
        Jumps {
            suspends: None,
            moved: None,
        }
    }

    /// A fresh watch that sees only the jumps after this call: take it
    /// before reading the clock, then sleep on [`Jumps::next`].
    pub(crate) fn watch(&self) -> Jumps {
        Jumps {
            suspends: self.suspends.as_ref().map(fresh),
            moved: self.moved.as_ref().map(fresh),
        }
    }

    /// Completes at the next jump; never if this clock cannot jump.
    pub(crate) async fn next(&mut self) {
        tokio::select! {
            biased;
            () = changed(self.suspends.as_mut()) => {}
            () = changed(self.moved.as_mut()) => {}
        }
    }
}

/// A clone that counts only changes made after this call.
fn fresh<T>(rx: &watch::Receiver<T>) -> watch::Receiver<T> {
    let mut rx = rx.clone();
    rx.mark_unchanged();
    rx
}

/// The next change; never if there is no sender (or no receiver).
async fn changed<T>(rx: Option<&mut watch::Receiver<T>>) {
    if let Some(rx) = rx {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

impl Default for LeaseClock {
    fn default() -> Self {
        Self::boottime()
    }
}

impl fmt::Debug for LeaseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (&self.adjust, &self.runtime_base) {
            (_, Some(_)) => "LeaseClock::runtime",
            (Some(_), None) => "LeaseClock::adjustable",
            (None, None) => "LeaseClock::boottime",
        })
    }
}

/// Suspend detection. Runtime timers (`tokio::time`) run on
/// `CLOCK_MONOTONIC`, which stops while the machine is suspended; the lease
/// clock does not. Rather than every guard waking each second to compare
/// the two, one thread per process does it while anyone listens, and
/// announces each suspend it sees: one wake-up a second in all.
#[cfg(any(target_os = "linux", target_os = "android"))]
mod suspend {
    use std::sync::{Mutex, OnceLock};
    use std::time::{Duration, Instant};

    use tokio::sync::watch;

    /// How often the detector looks; a suspend is announced within this.
    const LOOK_EVERY: Duration = Duration::from_secs(1);
    /// The two clocks are read one after the other: a smaller drift is noise.
    const NOISE: Duration = Duration::from_millis(20);

    struct Detector {
        /// Counts suspends seen.
        suspends: watch::Sender<u64>,
        /// Whether the thread is running; changed only under this lock,
        /// together with a look at the receiver count.
        running: Mutex<bool>,
    }

    static DETECTOR: OnceLock<Detector> = OnceLock::new();

    pub(super) fn subscribe() -> Option<watch::Receiver<u64>> {
        let detector = DETECTOR.get_or_init(|| Detector {
            suspends: watch::Sender::new(0),
            running: Mutex::new(false),
        });
        // Subscribe first: the thread only stops when it sees no receiver
        // under the lock, so either it sees this one or we see it stopped.
        let rx = detector.suspends.subscribe();
        let mut running = crate::lock_unpoisoned(&detector.running);
        if !*running {
            // The baseline is taken now, not when the thread first runs: a
            // suspend in between must count.
            let baseline = (Instant::now(), super::raw_now());
            let spawned = std::thread::Builder::new()
                .name("volcano-suspend-watch".into())
                .spawn(move || watch_for_suspends(detector, baseline));
            match spawned {
                Ok(_) => *running = true,
                Err(err) => tracing::warn!(
                    error = %err,
                    "cannot start the suspend detector; a suspend is noticed at the next renewal"
                ),
            }
        }
        Some(rx)
    }

    /// How far the suspend-aware clock is ahead of the runtime's clock.
    fn drift(origin: Instant, boot_origin: Duration) -> Duration {
        super::raw_now()
            .saturating_sub(boot_origin)
            .saturating_sub(origin.elapsed())
    }

    #[cfg(test)]
    pub(super) fn running() -> bool {
        DETECTOR
            .get()
            .is_some_and(|d| *crate::lock_unpoisoned(&d.running))
    }

    fn watch_for_suspends(detector: &'static Detector, (origin, boot_origin): (Instant, Duration)) {
        let mut seen = Duration::ZERO;
        loop {
            std::thread::sleep(LOOK_EVERY);
            let now = drift(origin, boot_origin);
            if now > seen + NOISE {
                detector.suspends.send_modify(|n| *n += 1);
            }
            seen = seen.max(now);
            let mut running = crate::lock_unpoisoned(&detector.running);
            if detector.suspends.receiver_count() == 0 {
                *running = false;
                return;
            }
        }
    }
}

/// Elsewhere the lease clock is the runtime's monotonic clock: no drift.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
mod suspend {
    pub(super) fn subscribe() -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn raw_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn raw_now() -> Duration {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    use std::time::Instant;

    #[test]
    fn boottime_moves_forward_and_adjustable_jumps() {
        let clock = LeaseClock::boottime();
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(clock.now() >= a + Duration::from_millis(5));
        clock.advance(Duration::from_secs(100)); // ignored
        assert!(clock.now() < a + Duration::from_secs(100));

        let adjustable = LeaseClock::adjustable();
        let b = adjustable.now();
        adjustable.advance(Duration::from_secs(100));
        assert!(adjustable.now() >= b + Duration::from_secs(100));
    }

    #[test]
    fn huge_advances_saturate_and_never_go_back() {
        let clock = LeaseClock::adjustable();
        clock.advance(Duration::MAX);
        let far = clock.now();
        clock.advance(Duration::MAX);
        clock.advance(Duration::from_secs(1));
        assert!(clock.now() >= far);
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn the_suspend_detector_runs_only_while_someone_listens() {
        let jumps = LeaseClock::boottime().jumps();
        assert!(suspend::running());
        drop(jumps);
        // It looks once a second; other tests may listen for a moment too.
        let until = Instant::now() + Duration::from_secs(10);
        while suspend::running() {
            assert!(
                Instant::now() < until,
                "the detector outlived its listeners"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[tokio::test]
    async fn an_advance_wakes_a_jump_watch_and_an_earlier_one_does_not() {
        let clock = LeaseClock::adjustable();
        let jumps = clock.jumps();
        clock.advance(Duration::from_secs(1)); // before the watch: not seen
        let mut watch = jumps.watch();
        let next = tokio::time::timeout(Duration::from_millis(50), watch.next()).await;
        assert!(next.is_err(), "an old jump does not wake a new watch");
        let waiting = tokio::spawn(async move { watch.next().await });
        clock.advance(Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("an advance wakes the watch")
            .unwrap();
    }
}
