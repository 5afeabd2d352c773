//! `LockLease` and `LockState`, and their strict decoding from server JSON.

use std::fmt;
use std::sync::Arc;

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
    // Shared: a release or a renewal's new lease copies no text.
    key: Arc<str>,
    token: Arc<str>,
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
            key: key.into().into(),
            token: token.into().into(),
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

    /// The key and token, shared, for the next lease of the same ownership.
    pub(crate) fn owner(&self) -> (Arc<str>, Arc<str>) {
        (self.key.clone(), self.token.clone())
    }

    /// Decodes an acquire or renew body; both members are required.
    pub(crate) fn decode(
        (key, token): (Arc<str>, Arc<str>),
        body: Fields,
    ) -> Result<Self, InvalidReason> {
        let fencing_token = body
            .fencing_token
            .get(InvalidReason::FencingToken)?
            .ok_or(InvalidReason::FencingToken)?;
        let expires_at = body
            .expires_at
            .get(InvalidReason::Expiry)?
            .ok_or(InvalidReason::Expiry)?;
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
///
/// Two states are equal when they say the same of the lock (held, expiry,
/// fencing token), whenever they were read.
#[derive(Debug, Clone)]
pub struct LockState {
    held: bool,
    expires_at: Option<DateTime<Utc>>,
    fencing_token: Option<i64>,
    /// The answer's `Date`: the service's clock when it answered.
    read_at: Option<DateTime<Utc>>,
}

impl PartialEq for LockState {
    fn eq(&self, other: &Self) -> bool {
        (self.held, self.expires_at, self.fencing_token)
            == (other.held, other.expires_at, other.fencing_token)
    }
}

impl Eq for LockState {}

impl LockState {
    /// Builds a state from its parts.
    pub fn new(held: bool, expires_at: Option<DateTime<Utc>>, fencing_token: Option<i64>) -> Self {
        LockState {
            held,
            expires_at,
            fencing_token,
            read_at: None,
        }
    }

    /// When the service answered, by its own clock (its `Date` header,
    /// whole seconds); `None` for a state built with [`LockState::new`] or
    /// an answer without a `Date`.
    pub fn read_at(&self) -> Option<DateTime<Utc>> {
        self.read_at
    }

    /// How long, at least, the holder's lease had left when the service
    /// answered: `expires_at` minus the answer's `Date`, both on the
    /// service's clock, so a skewed clock on this machine does not change
    /// it. `Date` has whole seconds, so a second is taken off (this can be
    /// up to a second short, never long). Without a `Date`, this machine's
    /// clock now. `None` when free; zero once past the expiry (in the
    /// service's grace).
    pub fn remaining(&self) -> Option<std::time::Duration> {
        let expires_at = self.expires_at.filter(|_| self.held)?;
        let now = match self.read_at {
            Some(date) => date + chrono::TimeDelta::seconds(1),
            None => Utc::now(),
        };
        Some((expires_at - now).to_std().unwrap_or_default())
    }

    /// The same state, read at `date` (the answer's `Date`).
    pub(crate) fn read_at_date(mut self, date: Option<DateTime<Utc>>) -> Self {
        self.read_at = date;
        self
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
    pub(crate) fn decode(body: Fields) -> Result<Self, InvalidReason> {
        let held = match body.held {
            Member::Valid(held) => held,
            _ => return Err(InvalidReason::HeldFlag),
        };
        let expires_at = body.expires_at.get(InvalidReason::Expiry)?;
        let fencing_token = body.fencing_token.get(InvalidReason::FencingToken)?;
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
            read_at: None,
        })
    }
}

/// One member of a lease or state body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Member<T> {
    #[default]
    Absent,
    /// Present, but not of the type or form the protocol gives it.
    Invalid,
    Valid(T),
}

impl<T> Member<T> {
    /// `None` when absent; `reason` when present but invalid.
    fn get(self, reason: InvalidReason) -> Result<Option<T>, InvalidReason> {
        match self {
            Member::Absent => Ok(None),
            Member::Invalid => Err(reason),
            Member::Valid(value) => Ok(Some(value)),
        }
    }

    #[cfg(test)]
    fn is_invalid(&self) -> bool {
        matches!(self, Member::Invalid)
    }
}

/// The members of a lease (acquire, renew) or state (get) body that the
/// SDK reads; any others are ignored. Read through a `serde_json` object:
/// one strict reading. (A visitor that skipped the object saved 1.3 % of
/// the client's instructions per request, about 0.3 % of its time, at the
/// price of a second decoder and a test proving the two agree;
/// docs/benchmarks.md section 1b.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Fields {
    held: Member<bool>,
    expires_at: Member<DateTime<Utc>>,
    fencing_token: Member<i64>,
}

impl Fields {
    /// The members of a success body; `NotAnObject` when it is not a JSON
    /// object.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Fields, InvalidReason> {
        let body = crate::ops::json_object(bytes).ok_or(InvalidReason::NotAnObject)?;
        Ok(Fields::from_object(&body))
    }

    fn from_object(body: &Map<String, Value>) -> Fields {
        fn member<T>(value: Option<&Value>, read: impl Fn(&Value) -> Option<T>) -> Member<T> {
            match value {
                None => Member::Absent,
                Some(value) => read(value).map_or(Member::Invalid, Member::Valid),
            }
        }
        Fields {
            held: member(body.get("held"), Value::as_bool),
            expires_at: member(body.get("expires_at"), |v| v.as_str().and_then(rfc3339)),
            fencing_token: member(body.get("fencing_token"), Value::as_i64),
        }
    }
}

/// An RFC 3339 timestamp, with or without fractional seconds, in UTC.
fn rfc3339(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(json: &str) -> Result<LockLease, InvalidReason> {
        LockLease::decode(("k".into(), "t".into()), Fields::parse(json.as_bytes())?)
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

    /// Members are read by type; a repeated one counts as its last
    /// occurrence; members the SDK does not read are ignored, whatever
    /// they hold; anything but one JSON object is `NotAnObject`.
    #[test]
    fn one_strict_reading() {
        let fields = |body: &str| Fields::parse(body.as_bytes());
        let read = fields(r#"{"held":true,"fencing_token":1,"fencing_token":2,"x":[1,{"y":"z"}]}"#)
            .unwrap();
        assert_eq!(read.held, Member::Valid(true));
        assert_eq!(read.fencing_token, Member::Valid(2));
        assert_eq!(read.expires_at, Member::Absent);
        let wrong = fields(r#"{"held":"true","expires_at":5,"fencing_token":7.0}"#).unwrap();
        assert!(wrong.held.is_invalid() && wrong.expires_at.is_invalid());
        assert!(wrong.fencing_token.is_invalid());
        let mut invalid_utf8 = br#"{"fencing_token":1,"x":""#.to_vec();
        invalid_utf8.extend_from_slice(&[0xff, b'"', b'}']);
        assert_eq!(
            Fields::parse(&invalid_utf8),
            Err(InvalidReason::NotAnObject)
        );
        for not_an_object in ["[1]", "1", r#""x""#, "null", "{", "", r#"{"held":true} x"#] {
            assert_eq!(
                fields(not_an_object),
                Err(InvalidReason::NotAnObject),
                "{not_an_object}"
            );
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
