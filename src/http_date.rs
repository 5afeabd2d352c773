//! The server's clock as HTTP carries it: the `Date` header every answer
//! has, and `Retry-After` as seconds or as a date on that clock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::{HeaderMap, DATE};

/// Parses an HTTP-date (RFC 9110: IMF-fixdate, `Sun, 06 Nov 1994 08:49:37
/// GMT`, and the two obsolete forms a recipient must still accept);
/// anything else, a weekday that does not match the date included, is
/// `None`.
pub(crate) fn http_date(value: &str) -> Option<DateTime<Utc>> {
    httpdate::parse_http_date(value.trim())
        .ok()
        .map(DateTime::<Utc>::from)
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
    fn http_dates_in_the_three_forms_and_nothing_else() {
        let want = http_date("Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(want.unwrap().to_rfc3339(), "1994-11-06T08:49:37+00:00");
        assert_eq!(http_date("Sunday, 06-Nov-94 08:49:37 GMT"), want);
        assert_eq!(http_date("Sun Nov  6 08:49:37 1994"), want);
        assert!(http_date("Tue, 29 Feb 2028 23:59:59 GMT").is_some());
        assert!(http_date("Fri, 31 Dec 9999 23:59:59 GMT").is_some());
        for v in [
            "Sun, 31 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nox 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 1994 08-49-37 GMT",
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 23:59:60 GMT",
            "Sun, 6 Nov 1994 08:49:37 +0000",
        ] {
            assert_eq!(http_date(v), None, "{v}");
        }
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
