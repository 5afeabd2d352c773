//! The movable server clock: real time plus whatever `advance` added. It
//! never goes back and never passes its limit, so the lease arithmetic
//! (now + ttl, + 90 days, + the grace) cannot overflow. Every response's
//! `Date` header is this clock's time, in HTTP's format.

use std::fmt;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::http::HeaderValue;
use chrono::{DateTime, SecondsFormat, Timelike, Utc};

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
/// # use volcano_mock_server::MockServer;
/// let server = MockServer::start().await;
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
    /// The wall time at `base`, in Unix seconds and nanoseconds.
    base_secs: i64,
    base_nanos: u32,
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
            base_secs: epoch.timestamp(),
            // A leap second's extra nanoseconds (never from `Utc::now`) are dropped.
            base_nanos: epoch.timestamp_subsec_nanos().min(999_999_999),
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
        // In integers: this is read several times per request, and chrono's
        // general date arithmetic costs several times as much.
        const NANOS: i64 = 1_000_000_000;
        let elapsed = self.base.elapsed();
        let nanos = i64::from(self.base_nanos)
            + i64::from(elapsed.subsec_nanos())
            + offset_ms.rem_euclid(1000) * 1_000_000;
        let secs = self
            .base_secs
            .checked_add(i64::try_from(elapsed.as_secs()).ok()?)?
            .checked_add(offset_ms.div_euclid(1000))?
            .checked_add(nanos / NANOS)?;
        let nanos = (nanos % NANOS) as u32;
        if secs > LIMIT_SECS || (secs == LIMIT_SECS && nanos > 0) {
            return None;
        }
        DateTime::from_timestamp(secs, nanos)
    }
}

/// `time` as the JSON bodies carry it: RFC 3339 in UTC, to the
/// millisecond (`2024-05-01T12:00:00.000Z`).
pub(crate) fn json_time(time: DateTime<Utc>) -> String {
    // A leap second (never read off this clock) is left to chrono.
    match Civil::of(time).filter(|_| time.nanosecond() < 1_000_000_000) {
        Some(c) => {
            // From the civil date computed here: this is on every lease
            // answer, and chrono's general formatter costs several times as
            // much.
            let mut text = String::with_capacity(24);
            let _ = write!(
                text,
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                c.year,
                c.month,
                c.day,
                c.hour,
                c.minute,
                c.second,
                time.timestamp_subsec_millis()
            );
            text
        }
        None => time.to_rfc3339_opts(SecondsFormat::Millis, true),
    }
}

/// `time` as an HTTP `Date` (RFC 7231 IMF-fixdate), truncated to the whole
/// second as real servers send it: `expires_at - Date` may overstate the
/// time left by under a second, which a careful client allows for (the
/// SDK subtracts a second).
pub(crate) fn http_date(time: DateTime<Utc>) -> HeaderValue {
    thread_local! {
        /// The last second formatted on this thread: most answers in a
        /// second share it (a clone shares the bytes).
        static LAST: std::cell::RefCell<Option<(i64, HeaderValue)>> =
            const { std::cell::RefCell::new(None) };
    }
    let second = time.timestamp();
    LAST.with_borrow_mut(|last| match last {
        Some((at, value)) if *at == second => value.clone(),
        _ => {
            let value = format_http_date(time);
            *last = Some((second, value.clone()));
            value
        }
    })
}

fn format_http_date(time: DateTime<Utc>) -> HeaderValue {
    const EPOCH: HeaderValue = HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT");
    // httpdate writes the years 1970 to 9998 (and would panic on others);
    // a clock started in an earlier year (the simulation may) goes through
    // chrono. IMF-fixdate has no form for years past 9999 or before 0.
    let secs = time.timestamp();
    if (0..253_370_764_800).contains(&secs) {
        // Whole seconds: a leap second (chrono's nanoseconds past 1e9) is
        // still the 59th.
        let whole = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs.unsigned_abs());
        return HeaderValue::from_str(&httpdate::fmt_http_date(whole)).unwrap_or(EPOCH);
    }
    if !(0..=9999).contains(&chrono::Datelike::year(&time)) {
        return EPOCH;
    }
    let whole = time.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    HeaderValue::from_str(&whole).unwrap_or(EPOCH)
}

/// A time's calendar fields in UTC (the leap second's extra nanoseconds
/// aside), computed from its Unix seconds without chrono's general
/// calendar code.
struct Civil {
    year: u32,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

impl Civil {
    /// The fields, if the year is written with four digits (0 to 9999).
    fn of(time: DateTime<Utc>) -> Option<Civil> {
        let secs = time.timestamp();
        let days = secs.div_euclid(86_400);
        let of_day = secs.rem_euclid(86_400) as u32;
        // Days to a proleptic Gregorian date, counting 400-year eras from
        // 0000-03-01 (so the leap day ends a year).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let of_era = z.rem_euclid(146_097);
        let year_of_era = (of_era - of_era / 1_460 + of_era / 36_524 - of_era / 146_096) / 365;
        let of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let mp = (5 * of_year + 2) / 153;
        let day = (of_year - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = year_of_era + era * 400 + i64::from(month <= 2);
        let year = u32::try_from(year).ok().filter(|y| *y <= 9999)?;
        Some(Civil {
            year,
            month,
            day,
            hour: of_day / 3_600,
            minute: of_day / 60 % 60,
            second: of_day % 60,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

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

    /// The hand-written formats agree with chrono's across the range the
    /// clock can show, leap days, leap seconds and millisecond edges.
    #[test]
    fn hand_written_formats_agree_with_chrono() {
        let mut checked = 0;
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut times = vec![
            at("1970-01-01T00:00:00Z"),
            at("2024-02-29T23:59:59.999Z"),
            at("2026-12-31T23:59:59.9999Z"),
            at("1000-01-01T00:00:00.001Z"),
            at("0999-03-01T01:02:03.004Z"),
            limit(),
        ];
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let secs = (seed % LIMIT_SECS as u64) as i64;
            let nanos = (seed >> 40) as u32 % 1_000_000_000;
            times.push(DateTime::from_timestamp(secs, nanos).unwrap());
        }
        // A leap second (chrono represents it with nanoseconds >= 1e9).
        times.push(
            chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
                .unwrap()
                .and_hms_milli_opt(23, 59, 59, 1_500)
                .unwrap()
                .and_utc(),
        );
        for time in times {
            assert_eq!(
                json_time(time),
                time.to_rfc3339_opts(SecondsFormat::Millis, true),
                "{time:?}"
            );
            let whole = DateTime::from_timestamp(time.timestamp(), 0).unwrap();
            assert_eq!(
                http_date(time),
                whole.format("%a, %d %b %Y %H:%M:%S GMT").to_string(),
                "{time:?}"
            );
            checked += 1;
        }
        assert!(checked > 20_000);
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
