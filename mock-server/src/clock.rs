//! The movable server clock: real time plus whatever `advance` added. It
//! never goes back and never passes its limit, so the lease arithmetic
//! (now + ttl, + 90 days, + the grace) cannot overflow. Every response's
//! `Date` header is this clock's time, in HTTP's format.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::http::HeaderValue;
use chrono::{DateTime, Datelike, SecondsFormat, TimeDelta, Timelike, Utc};

/// The latest time the clock shows, 9000-01-01T00:00:00Z, in Unix seconds.
/// Far below chrono's end (year 262143), so `now + 90 days + ttl + grace`
/// always fits, and the `Date` header keeps the four-digit year IMF-fixdate
/// needs.
const LIMIT_SECS: i64 = 221_845_392_000;

fn limit() -> DateTime<Utc> {
    DateTime::from_timestamp(LIMIT_SECS, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// An advance of the mock server clock that would take it past the latest
/// time it can show (9000-01-01T00:00:00Z). Nothing was changed.
///
/// ```no_run
/// # async fn demo() {
/// use std::time::Duration;
/// let server = volcano_mock_server::MockServer::start().await;
/// let err = server.try_advance(Duration::MAX).unwrap_err();
/// println!("{err} (limit {})", err.limit());
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockRangeError {
    by: Duration,
}

impl ClockRangeError {
    /// The latest time the mock server clock can show.
    pub fn limit(&self) -> DateTime<Utc> {
        limit()
    }
}

impl fmt::Display for ClockRangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "advancing the mock server clock by {:?} would take it past {}, the latest time it can show",
            self.by,
            limit().to_rfc3339()
        )
    }
}

impl std::error::Error for ClockRangeError {}

/// Real time since the server started plus the advanced offset.
pub(crate) struct Clock {
    base_wall: DateTime<Utc>,
    base: tokio::time::Instant,
    /// Only ever grows, and only up to what keeps the clock within the limit.
    offset_ms: AtomicI64,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self::starting_at(Utc::now())
    }

    /// A clock that reads `epoch` now and runs on the runtime's clock.
    pub(crate) fn starting_at(epoch: DateTime<Utc>) -> Self {
        Clock {
            base_wall: epoch,
            base: tokio::time::Instant::now(),
            offset_ms: AtomicI64::new(0),
        }
    }

    /// The server's time; monotonic, and never past the limit.
    pub(crate) fn now(&self) -> DateTime<Utc> {
        // `at` fails only past the limit (real time alone cannot get there
        // in practice): saturating keeps the clock monotonic.
        self.at(self.offset_ms.load(Ordering::Acquire))
            .unwrap_or_else(limit)
    }

    /// Moves the clock forward by `by` (to the millisecond, rounded down)
    /// and returns the time it moved to; refuses, changing nothing, when
    /// that would pass the limit. Concurrent advances add up.
    pub(crate) fn try_advance(&self, by: Duration) -> Result<DateTime<Utc>, ClockRangeError> {
        let refused = ClockRangeError { by };
        let step = i64::try_from(by.as_millis()).map_err(|_| refused)?;
        let mut current = self.offset_ms.load(Ordering::Acquire);
        loop {
            let next = current.checked_add(step).ok_or(refused)?;
            let moved_to = self.at(next).ok_or(refused)?;
            match self.offset_ms.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(moved_to),
                Err(seen) => current = seen,
            }
        }
    }

    /// The time with this offset, if it is within the limit.
    fn at(&self, offset_ms: i64) -> Option<DateTime<Utc>> {
        let elapsed = TimeDelta::from_std(self.base.elapsed()).ok()?;
        let offset = TimeDelta::try_milliseconds(offset_ms)?;
        let time = self
            .base_wall
            .checked_add_signed(elapsed)?
            .checked_add_signed(offset)?;
        (time <= limit()).then_some(time)
    }
}

/// `time` as the JSON bodies carry it: RFC 3339 in UTC, to the
/// millisecond (`2024-05-01T12:00:00.000Z`).
pub(crate) fn json_time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `time` as an HTTP `Date` (RFC 7231 IMF-fixdate), truncated to the whole
/// second as real servers send it: `expires_at - Date` may overstate the
/// time left by under a second, which a careful client allows for (the
/// SDK subtracts a second).
pub(crate) fn http_date(time: DateTime<Utc>) -> HeaderValue {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = DateTime::from_timestamp(time.timestamp(), 0).unwrap_or(time);
    let text = format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        DAYS[t.weekday().num_days_from_monday() as usize],
        t.day(),
        MONTHS[t.month0() as usize],
        t.year(),
        t.hour(),
        t.minute(),
        t.second(),
    );
    // Only ASCII letters, digits, spaces, ',' and ':' were written.
    HeaderValue::try_from(text).unwrap_or(HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn the_limit_is_the_year_9000() {
        assert_eq!(limit(), at("9000-01-01T00:00:00Z"));
        // The lease arithmetic in state.rs still fits at the limit.
        let far = limit() + TimeDelta::days(90) + TimeDelta::seconds(7_776_000 + 1);
        assert!(far > limit());
    }

    #[test]
    fn advances_add_up_and_huge_ones_change_nothing() {
        let clock = Clock::new();
        let before = clock.now();
        let moved = clock.try_advance(Duration::from_secs(86_400)).unwrap();
        assert!(moved >= before + TimeDelta::days(1));
        for huge in [
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            Duration::from_millis(i64::MAX as u64),
            Duration::from_secs(8_000 * 366 * 86_400),
        ] {
            let err = clock.try_advance(huge).unwrap_err();
            assert!(err.to_string().contains("9000-01-01T00:00:00"), "{err}");
            assert_eq!(err.limit(), limit());
        }
        let after = clock.now();
        assert!(after >= moved && after < moved + TimeDelta::hours(1));
    }

    #[test]
    fn the_clock_reaches_its_limit_and_stays_there() {
        let clock = Clock::new();
        let to_limit = (limit() - clock.now()).to_std().unwrap() - Duration::from_secs(5);
        clock.try_advance(to_limit).unwrap();
        assert!(clock.try_advance(Duration::from_secs(60)).is_err());
        let near = clock.now();
        assert!(near <= limit() && near > limit() - TimeDelta::seconds(10));
        // Repeated large advances never wrap the offset backwards.
        for _ in 0..10 {
            assert!(clock
                .try_advance(Duration::from_millis(i64::MAX as u64 / 2))
                .is_err());
        }
        assert!(clock.now() >= near);
        assert_eq!(http_date(limit()), "Wed, 01 Jan 9000 00:00:00 GMT");
    }

    #[test]
    fn concurrent_advances_all_count() {
        let clock = std::sync::Arc::new(Clock::new());
        let before = clock.now();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let clock = clock.clone();
                std::thread::spawn(move || {
                    for _ in 0..1_000 {
                        clock.try_advance(Duration::from_secs(1)).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let gained = clock.now() - before;
        assert!(gained >= TimeDelta::seconds(8_000), "{gained}");
        assert!(gained < TimeDelta::seconds(8_000 + 3_600), "{gained}");
    }

    #[test]
    fn http_dates_are_imf_fixdate_truncated() {
        assert_eq!(
            http_date(at("1994-11-06T08:49:37Z")),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        assert_eq!(
            http_date(at("1994-11-06T08:49:37.999Z")),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        assert_eq!(
            http_date(at("2027-01-01T00:00:00.5Z")),
            "Fri, 01 Jan 2027 00:00:00 GMT"
        );
    }
}
