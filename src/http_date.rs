//! The server's clock as HTTP carries it: the `Date` header every answer
//! has, and `Retry-After` as seconds or as a date on that clock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::{HeaderMap, DATE};

/// Parses an HTTP `Date` header (IMF-fixdate, `Sun, 06 Nov 1994 08:49:37
/// GMT`); other forms are ignored.
pub(crate) fn http_date(value: &str) -> Option<DateTime<Utc>> {
    let value = value.trim();
    imf_fixdate(value).or_else(|| {
        DateTime::parse_from_rfc2822(value)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    })
}

/// The one form servers send (RFC 9110 IMF-fixdate, `Sun, 06 Nov 1994
/// 08:49:37 GMT`), read by position: about a fifth of the general parser's
/// instructions. Anything else, a weekday that does not match the date
/// included, falls to the general parser, which then decides.
fn imf_fixdate(value: &str) -> Option<DateTime<Utc>> {
    use chrono::Datelike;
    const WEEKDAYS: [&[u8; 3]; 7] = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun"];
    let b = value.as_bytes();
    if b.len() != 29 || &b[3..5] != b", " || &b[25..] != b" GMT" {
        return None;
    }
    let number = |from: usize, len: usize| -> Option<u32> {
        b[from..from + len].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let month = MONTHS.iter().position(|m| m[..] == b[8..11])? as u32 + 1;
    if b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || b[19] != b':' || b[22] != b':' {
        return None;
    }
    let date = chrono::NaiveDate::from_ymd_opt(number(12, 4)? as i32, month, number(5, 2)?)?;
    if WEEKDAYS[date.weekday().num_days_from_monday() as usize][..] != b[..3] {
        return None;
    }
    let time = chrono::NaiveTime::from_hms_opt(number(17, 2)?, number(20, 2)?, number(23, 2)?)?;
    Some(date.and_time(time).and_utc())
}

/// The answer's `Date`: the server's clock when it answered.
pub(crate) fn answer_date(headers: &HeaderMap) -> Option<DateTime<Utc>> {
    headers
        .get(DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(http_date)
}

/// `Retry-After` as delay-seconds or as an HTTP-date. A date is measured
/// from the answer's own `Date` (both on the server's clock) when there is
/// one, else from this machine's clock; a date already past is zero.
pub(crate) fn retry_after(
    value: &str,
    date: impl FnOnce() -> Option<DateTime<Utc>>,
) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = http_date(value)?;
    let from = date().unwrap_or_else(Utc::now);
    Some((at - from).to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_read_fast_agree_with_the_general_parser() {
        let general = |v: &str| {
            DateTime::parse_from_rfc2822(v)
                .ok()
                .map(|t| t.with_timezone(&Utc))
        };
        for v in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Mon, 30 Nov 2026 12:00:00 GMT",
            "Tue, 29 Feb 2028 23:59:59 GMT",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            assert!(imf_fixdate(v).is_some(), "{v}");
            assert_eq!(imf_fixdate(v), general(v), "{v}");
        }
        for v in [
            "Sun, 31 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nox 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08-49-37 GMT",
            "Sun, 06 Nov +994 08:49:37 GMT",
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "sun, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 23:59:60 GMT",
        ] {
            assert_eq!(imf_fixdate(v), None, "{v}");
        }
        // Where the fast path declines, the answer is the general parser's.
        for v in [
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 23:59:60 GMT",
        ] {
            assert_eq!(http_date(v), general(v), "{v}");
        }
        // Other RFC 2822 forms still parse, through the general parser.
        assert_eq!(
            http_date("Sun, 6 Nov 1994 08:49:37 +0000"),
            general("Sun, 06 Nov 1994 08:49:37 GMT")
        );
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_as_a_date_on_the_servers_clock() {
        let date = http_date("Mon, 30 Nov 2026 12:00:00 GMT");
        assert_eq!(retry_after(" 7 ", || date), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after("Mon, 30 Nov 2026 12:00:30 GMT", || date),
            Some(Duration::from_secs(30)),
            "from the answer's Date, not this machine's clock"
        );
        assert_eq!(
            retry_after("Mon, 30 Nov 2026 11:59:00 GMT", || date),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", || date), None);
        assert_eq!(retry_after("-3", || date), None);
    }

    #[test]
    fn parses_the_date_header() {
        let date = http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(date.to_rfc3339(), "1994-11-06T08:49:37+00:00");
        assert_eq!(http_date("yesterday"), None);
    }
}
