//! `LockLease` and `LockState`, and their strict decoding from server JSON.

use std::fmt;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::error::InvalidReason;

/// A lease on a lock: proof of ownership until `expires_at`.
///
/// Immutable; `renew` returns a new one. Its `Debug` never shows the
/// ownership token.
///
/// Plain data: dropping a `LockLease` releases nothing and renews nothing
/// (unlike a `MutexGuard`). Release it yourself, or let
/// [`Locks::with_lock`](crate::Locks::with_lock) or
/// [`Locks::hold`](crate::Locks::hold) own the lock, renew it and release it.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// let lease = locks.acquire("nightly-report", Duration::from_secs(30)).await?;
/// println!("{} until {}, fence {}", lease.key(), lease.expires_at(), lease.fencing_token());
/// locks.release(&lease).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LockLease {
    key: String,
    token: String,
    expires_at: DateTime<Utc>,
    fencing_token: i64,
}

impl LockLease {
    /// Builds a lease from its parts, for example to release a lease after a
    /// restart from a persisted token. The SDK never checks it against the
    /// server until it is used.
    pub fn new(
        key: impl Into<String>,
        token: impl Into<String>,
        expires_at: DateTime<Utc>,
        fencing_token: i64,
    ) -> Self {
        LockLease {
            key: key.into(),
            token: token.into(),
            expires_at,
            fencing_token,
        }
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The ownership token, exactly as it was sent. Treat it as a secret:
    /// anyone holding it can renew or release the lease.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The server's advisory expiry. Do not use it for timing decisions on
    /// this machine: clocks differ. `with_lock` keeps its own deadline.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.expires_at
    }

    /// The fencing token: rises whenever the lock changes hands. Pass it to
    /// the protected resource, which must reject tokens lower than the
    /// highest it has seen.
    pub fn fencing_token(&self) -> i64 {
        self.fencing_token
    }

    /// Decodes an acquire or renew body; both members are required.
    pub(crate) fn decode(
        key: String,
        token: String,
        body: &Map<String, Value>,
    ) -> Result<Self, InvalidReason> {
        let fencing_token = fencing_token(body)?.ok_or(InvalidReason::FencingToken)?;
        let expires_at = expiry(body)?.ok_or(InvalidReason::Expiry)?;
        Ok(LockLease {
            key,
            token,
            expires_at,
            fencing_token,
        })
    }
}

impl fmt::Debug for LockLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLease")
            .field("key", &self.key)
            .field("token", &"[redacted]")
            .field("expires_at", &self.expires_at)
            .field("fencing_token", &self.fencing_token)
            .finish()
    }
}

/// What the service says about a lock right now (`get`).
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// let state = locks.get("nightly-report").await?;
/// if state.held() {
///     println!("held until {:?} by fence {:?}", state.expires_at(), state.fencing_token());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockState {
    held: bool,
    expires_at: Option<DateTime<Utc>>,
    fencing_token: Option<i64>,
}

impl LockState {
    /// Builds a state from its parts.
    pub fn new(held: bool, expires_at: Option<DateTime<Utc>>, fencing_token: Option<i64>) -> Self {
        LockState {
            held,
            expires_at,
            fencing_token,
        }
    }

    /// Whether the lock is unavailable: `false` means an acquire would
    /// succeed now. Stays `true` for about 1 s after expiry.
    pub fn held(&self) -> bool {
        self.held
    }

    /// The holder's advisory expiry (present when held).
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.expires_at
    }

    /// The holder's fencing token (present when held).
    pub fn fencing_token(&self) -> Option<i64> {
        self.fencing_token
    }

    /// Decodes a get body: `held` is required; when it is `true`, so are
    /// `expires_at` and `fencing_token`. Present fields are always checked.
    pub(crate) fn decode(body: &Map<String, Value>) -> Result<Self, InvalidReason> {
        let held = match body.get("held") {
            Some(Value::Bool(held)) => *held,
            _ => return Err(InvalidReason::HeldFlag),
        };
        let expires_at = expiry(body)?;
        let fencing_token = fencing_token(body)?;
        if held {
            if expires_at.is_none() {
                return Err(InvalidReason::Expiry);
            }
            if fencing_token.is_none() {
                return Err(InvalidReason::FencingToken);
            }
        }
        Ok(LockState {
            held,
            expires_at,
            fencing_token,
        })
    }
}

/// `expires_at` if present: an RFC 3339 timestamp, with or without fractional
/// seconds, converted to UTC.
fn expiry(body: &Map<String, Value>) -> Result<Option<DateTime<Utc>>, InvalidReason> {
    match body.get("expires_at") {
        None => Ok(None),
        Some(Value::String(text)) => DateTime::parse_from_rfc3339(text)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|_| InvalidReason::Expiry),
        Some(_) => Err(InvalidReason::Expiry),
    }
}

/// `fencing_token` if present: a JSON integer that fits an `i64` exactly.
fn fencing_token(body: &Map<String, Value>) -> Result<Option<i64>, InvalidReason> {
    match body.get("fencing_token") {
        None => Ok(None),
        Some(value) => value.as_i64().map(Some).ok_or(InvalidReason::FencingToken),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(json: &str) -> Map<String, Value> {
        match serde_json::from_str(json).unwrap() {
            Value::Object(map) => map,
            _ => panic!("not an object"),
        }
    }

    fn lease(json: &str) -> Result<LockLease, InvalidReason> {
        LockLease::decode("k".into(), "t".into(), &obj(json))
    }

    #[test]
    fn lease_fields_are_required_and_typed() {
        let ok = lease(
            r#"{"expires_at":"2026-07-20T14:00:10.123456Z","fencing_token":4503599627370497}"#,
        )
        .unwrap();
        assert_eq!(ok.fencing_token(), 4_503_599_627_370_497);
        assert_eq!(ok.expires_at().timestamp_subsec_micros(), 123_456);
        assert_eq!(
            lease(r#"{"expires_at":"2026-07-20T14:00:10Z"}"#),
            Err(InvalidReason::FencingToken)
        );
        assert_eq!(lease(r#"{"fencing_token":1}"#), Err(InvalidReason::Expiry));
        for bad_token in [
            r#""7""#,
            "7.0",
            "1e3",
            "9223372036854775808",
            "null",
            "true",
        ] {
            let json =
                format!(r#"{{"expires_at":"2026-07-20T14:00:10Z","fencing_token":{bad_token}}}"#);
            assert_eq!(
                lease(&json),
                Err(InvalidReason::FencingToken),
                "{bad_token}"
            );
        }
        for bad_time in [
            r#""not-a-time""#,
            "[]",
            "1700000000",
            r#""2026-07-20""#,
            "null",
        ] {
            let json = format!(r#"{{"expires_at":{bad_time},"fencing_token":1}}"#);
            assert_eq!(lease(&json), Err(InvalidReason::Expiry), "{bad_time}");
        }
    }

    #[test]
    fn offset_timestamps_become_utc() {
        let l = lease(r#"{"expires_at":"2026-07-20T16:00:10+02:00","fencing_token":1}"#).unwrap();
        assert_eq!(l.expires_at().to_rfc3339(), "2026-07-20T14:00:10+00:00");
    }

    #[test]
    fn debug_redacts_token() {
        let l = LockLease::new("k", "secret-token", Utc::now(), 1);
        let shown = format!("{l:?}");
        assert!(!shown.contains("secret-token"), "{shown}");
        assert!(shown.contains("[redacted]"));
    }
}
