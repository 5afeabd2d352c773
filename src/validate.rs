//! Local argument checks, applied before anything is sent.

use std::time::Duration;

use crate::error::{Error, Result};

/// Shortest lease the service grants.
pub const MIN_TTL: Duration = Duration::from_secs(5);
/// Longest lease the service grants, and the absolute cap of one acquisition
/// (90 days).
pub const MAX_TTL: Duration = Duration::from_secs(7_776_000);
/// Longest key the service accepts, in bytes (all key characters are ASCII).
pub(crate) const MAX_KEY_LEN: usize = 128;

/// Checks a lock key against `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$` (whole string).
pub(crate) fn key(key: &str) -> Result<()> {
    let bytes = key.as_bytes();
    let ok = match bytes.split_first() {
        Some((first, rest)) => {
            bytes.len() <= MAX_KEY_LEN
                && first.is_ascii_alphanumeric()
                && rest
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "key {:?} must be 1 to 128 characters: a letter or digit, then letters, digits, '.', '_', ':' or '-'",
            Shortened(key)
        )))
    }
}

/// Checks a ttl and returns it in whole seconds.
pub(crate) fn ttl(ttl: Duration) -> Result<u64> {
    if ttl.subsec_nanos() == 0 && (MIN_TTL..=MAX_TTL).contains(&ttl) {
        Ok(ttl.as_secs())
    } else {
        Err(Error::invalid(format!(
            "ttl must be whole seconds between 5 seconds and 90 days (7776000 s), got {}",
            seconds(ttl)
        )))
    }
}

/// The ttl that keeps a lease at least `d` from now: whole seconds,
/// rounded up, within [`MIN_TTL`, `MAX_TTL`] (a kept minimum's renewal).
pub(crate) fn ttl_covering(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0)).clamp(MIN_TTL, MAX_TTL)
}

/// `asked` under a `max_hold` cap with `cap_left` of it (if any): at most
/// the cap's whole seconds left, and none (`None`) once less than the
/// shortest lease is left of it, since any renewal would reach past it (a
/// kept minimum's keep, and the renewals back that put it right).
pub(crate) fn ttl_under_cap(asked: Duration, cap_left: Option<Duration>) -> Option<Duration> {
    match cap_left.map(|left| Duration::from_secs(left.as_secs())) {
        Some(whole) => (whole >= MIN_TTL).then(|| asked.min(whole)),
        None => Some(asked),
    }
}

/// A duration as a person writes it: `0 s`, `4 s`, `1.5 s`, `0.25 s`.
pub(crate) fn seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        return format!("{} s", d.as_secs());
    }
    let text = format!("{:.9}", d.as_secs_f64());
    format!("{} s", text.trim_end_matches('0'))
}

/// Checks that `value` is an 8-4-4-4-12 hex UUID string (any case).
/// The value itself is not echoed: an ownership token is a secret.
pub(crate) fn uuid(name: &str, value: &str) -> Result<()> {
    if is_uuid(value) {
        Ok(())
    } else {
        Err(Error::invalid(format!("{name} must be a UUID string")))
    }
}

pub(crate) fn is_uuid(value: &str) -> bool {
    // Of the forms `uuid` reads, only the hyphenated one is 36 long.
    value.len() == 36 && uuid::Uuid::try_parse(value).is_ok()
}

/// A new random (v4, lowercase, hyphenated) UUID string, from the
/// thread-local CSPRNG (no system call per id).
pub(crate) fn new_uuid() -> String {
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Builder::from_random_bytes(crate::random::bytes16())
        .into_uuid()
        .hyphenated()
        .encode_lower(&mut text)
        .to_owned()
}

/// Shows at most 64 characters of a rejected key in an error message.
struct Shortened<'a>(&'a str);

impl std::fmt::Debug for Shortened<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(64) {
            Some((cut, _)) => write!(f, "{:?}…", &self.0[..cut]),
            None => write!(f, "{:?}", self.0),
        }
    }
}

/// The shortest `max_hold`: a cap that ends a hold as soon as it begins
/// would only churn the lock.
const MIN_MAX_HOLD: Duration = Duration::from_secs(1);

/// A hold's bounds that fit: a `max_hold` of a second at least, and a
/// minimum hold of at most the longest lease and the `max_hold`. One check
/// for a lock's hold and a permit's (which checks before its line, so that
/// a bad one does not wait behind another waiter to be refused).
pub(crate) fn hold_bounds(min_hold: Option<Duration>, max_hold: Option<Duration>) -> Result<()> {
    if max_hold.is_some_and(|d| d < MIN_MAX_HOLD) {
        return Err(Error::invalid("max_hold must be at least 1 s"));
    }
    match (min_hold, max_hold) {
        (Some(min), _) if min > MAX_TTL => Err(Error::invalid(
            "min_hold must be at most 90 days (the longest a lease lives)",
        )),
        (Some(min), Some(max)) if min > max => Err(Error::invalid(format!(
            "min_hold ({}) must not exceed max_hold ({}): the lock cannot be kept longer than it may be held",
            seconds(min),
            seconds(max)
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for good in ["a", "A9", "build:queue", "x._:-y", &"k".repeat(128)] {
            assert!(key(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", ".a", "a/b", "a b", "a\n", "é", &"k".repeat(129)] {
            assert!(key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ttls() {
        assert_eq!(ttl(Duration::from_secs(5)).unwrap(), 5);
        assert_eq!(ttl(Duration::from_secs(7_776_000)).unwrap(), 7_776_000);
        for bad in [
            Duration::from_secs(4),
            Duration::from_secs(7_776_001),
            Duration::from_millis(5_500),
            Duration::ZERO,
        ] {
            assert!(ttl(bad).is_err(), "{bad:?}");
        }
        let said = |d| ttl(d).unwrap_err().to_string();
        assert!(
            said(Duration::ZERO).ends_with("got 0 s"),
            "{}",
            said(Duration::ZERO)
        );
        assert!(said(Duration::from_millis(1_500)).ends_with("got 1.5 s"));
        assert!(said(Duration::from_secs(4)).ends_with("got 4 s"));
    }

    #[test]
    fn uuids() {
        assert!(is_uuid("123e4567-E89B-12d3-a456-426614174000"));
        assert!(is_uuid(&new_uuid()));
        for bad in [
            "",
            "not-a-uuid",
            "123e4567e89b12d3a456426614174000",
            "123e4567-e89b-12d3-a456-42661417400g",
            "{123e4567-e89b-12d3-a456-426614174000}",
        ] {
            assert!(!is_uuid(bad), "{bad}");
        }
    }
}
