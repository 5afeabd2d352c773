//! The clock behind a scoped lock's local deadline.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
use std::time::Instant;

/// The clock a scoped lock measures its lease deadline with.
///
/// The default, [`LeaseClock::boottime`], keeps counting while the machine
/// is suspended (Linux `CLOCK_BOOTTIME`), so a laptop that sleeps through its
/// lease wakes up knowing the lease is gone. Wall-clock jumps never affect it.
///
/// [`LeaseClock::adjustable`] follows the same time but can be moved
/// forward, to simulate a suspend or a stalled process in tests.
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
    offset_ns: Option<Arc<AtomicU64>>,
}

impl LeaseClock {
    /// The suspend-aware clock (`CLOCK_BOOTTIME` on Linux; elsewhere the
    /// monotonic clock).
    pub fn boottime() -> Self {
        LeaseClock { offset_ns: None }
    }

    /// The same clock, plus an offset that [`LeaseClock::advance`] moves
    /// forward (never back).
    pub fn adjustable() -> Self {
        LeaseClock {
            offset_ns: Some(Arc::new(AtomicU64::new(0))),
        }
    }

    /// Moves an adjustable clock forward; no effect on the default clock.
    /// The offset saturates (at about 584 years) instead of wrapping, so the
    /// clock never goes back.
    pub fn advance(&self, by: Duration) {
        if let Some(offset) = &self.offset_ns {
            let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
            let _ = offset.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |o| {
                Some(o.saturating_add(ns))
            });
        }
    }

    /// The time since an arbitrary fixed origin.
    pub fn now(&self) -> Duration {
        let offset = self
            .offset_ns
            .as_ref()
            .map_or(0, |o| o.load(Ordering::Relaxed));
        raw_now() + Duration::from_nanos(offset)
    }
}

impl Default for LeaseClock {
    fn default() -> Self {
        Self::boottime()
    }
}

impl fmt::Debug for LeaseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.offset_ns.is_some() {
            "LeaseClock::adjustable"
        } else {
            "LeaseClock::boottime"
        })
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
}
