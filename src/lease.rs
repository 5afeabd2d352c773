//! `LockLease` and `LockState`, and their strict decoding from server JSON.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
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

    fn is_invalid(&self) -> bool {
        matches!(self, Member::Invalid)
    }
}

/// The members of a lease (acquire, renew) or state (get) body that the
/// SDK reads; any others are ignored.
///
/// [`Fields::parse`] reads them straight from the bytes, with no JSON tree
/// and no copy of the expiry's text. When that cannot decide (a member of
/// the wrong type, a member it does not read, a body that is not an
/// object, or a `serde_json` built to hand numbers over in another form),
/// the body is read the general way, into a `serde_json` object, and that
/// reading decides. So the fast path only ever agrees with the general one
/// (a test compares them).
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
        match serde_json::from_slice::<Fields>(bytes) {
            Ok(fields) if !fields.has_invalid() => Ok(fields),
            _ => Self::parse_general(bytes),
        }
    }

    /// The general reading, through a `serde_json` object.
    fn parse_general(bytes: &[u8]) -> Result<Fields, InvalidReason> {
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

    fn has_invalid(&self) -> bool {
        self.held.is_invalid() || self.expires_at.is_invalid() || self.fencing_token.is_invalid()
    }
}

/// An RFC 3339 timestamp, with or without fractional seconds, in UTC.
fn rfc3339(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}
// The fast reading: a visitor over the object's members, each value read
// by what it is (no tree), the expiry parsed from the borrowed text.

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(FieldsVisitor)
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
        let mut fields = Fields::default();
        // A repeated member counts as its last occurrence, as in a
        // `serde_json` object.
        while let Some(name) = map.next_key::<Name>()? {
            match name {
                Name::Held => fields.held = map.next_value::<Read<bool>>()?.0,
                Name::ExpiresAt => fields.expires_at = map.next_value::<Read<DateTime<Utc>>>()?.0,
                Name::FencingToken => fields.fencing_token = map.next_value::<Read<i64>>()?.0,
                // Skipping a member checks only its syntax (not a number's
                // range, a string's escapes, the depth), so a body with one
                // is left to the general reading. The service sends none.
                Name::Other => return Err(de::Error::custom("a member the SDK does not read")),
            }
        }
        Ok(fields)
    }
}

/// A member's name, matched without keeping it.
enum Name {
    Held,
    ExpiresAt,
    FencingToken,
    Other,
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl Visitor<'_> for NameVisitor {
            type Value = Name;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Name, E> {
                Ok(match name {
                    "held" => Name::Held,
                    "expires_at" => Name::ExpiresAt,
                    "fencing_token" => Name::FencingToken,
                    _ => Name::Other,
                })
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

/// What a member's value may be read as; anything else is invalid.
trait Readable: Sized {
    fn from_bool(_: bool) -> Option<Self> {
        None
    }
    fn from_i64(_: i64) -> Option<Self> {
        None
    }
    fn from_str(_: &str) -> Option<Self> {
        None
    }
}

impl Readable for bool {
    fn from_bool(value: bool) -> Option<Self> {
        Some(value)
    }
}

impl Readable for i64 {
    fn from_i64(value: i64) -> Option<Self> {
        Some(value)
    }
}

impl Readable for DateTime<Utc> {
    fn from_str(text: &str) -> Option<Self> {
        rfc3339(text)
    }
}

/// One member's value, read as `T` or marked invalid; a value of any other
/// type is skipped whole.
struct Read<T>(Member<T>);

impl<'de, T: Readable> Deserialize<'de> for Read<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(ReadVisitor(std::marker::PhantomData))
            .map(Read)
    }
}

struct ReadVisitor<T>(std::marker::PhantomData<T>);

impl<T> ReadVisitor<T> {
    fn member(value: Option<T>) -> Member<T> {
        value.map_or(Member::Invalid, Member::Valid)
    }
}

impl<'de, T: Readable> Visitor<'de> for ReadVisitor<T> {
    type Value = Member<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Member<T>, E> {
        Ok(Self::member(T::from_bool(value)))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Member<T>, E> {
        Ok(Self::member(T::from_i64(value)))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Member<T>, E> {
        Ok(Self::member(
            i64::try_from(value).ok().and_then(T::from_i64),
        ))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Member<T>, E> {
        Ok(Member::Invalid)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Member<T>, E> {
        Ok(Self::member(T::from_str(text)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Member<T>, E> {
        Ok(Member::Invalid)
    }

    fn visit_none<E: de::Error>(self) -> Result<Member<T>, E> {
        Ok(Member::Invalid)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Member<T>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Member::Invalid)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Member<T>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Member::Invalid)
    }
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

    /// The fast reading never disagrees with the general one: on every
    /// combination of valid, invalid and absent members, in both orders,
    /// with repeats and with members the SDK does not read.
    #[test]
    fn the_fast_reading_agrees_with_the_general_one() {
        let held = [
            None,
            Some("true"),
            Some("false"),
            Some("null"),
            Some("1"),
            Some(r#""true""#),
        ];
        let expires = [
            None,
            Some(r#""2026-07-20T14:00:10.123Z""#),
            Some(r#""2026-07-20T14:00:10\u005A""#),
            Some(r#""2026-07-20T16:00:10+02:00""#),
            Some(r#""not-a-time""#),
            Some("5"),
            Some("null"),
            Some("[]"),
            Some(r#"{"a":1}"#),
        ];
        let fences = [
            None,
            Some("1"),
            Some("-1"),
            Some("9223372036854775807"),
            Some("-9223372036854775808"),
            Some("9223372036854775808"),
            Some("7.0"),
            Some("1e3"),
            Some(r#""7""#),
            Some("null"),
            Some("[1,[2]]"),
        ];
        let extras = [
            None,
            Some(r#""x":[1,{"y":"z"}]"#),
            Some(r#""fencing_token":2"#),
        ];
        let mut checked = 0;
        for h in held {
            for e in expires {
                for f in fences {
                    for x in extras {
                        let mut members: Vec<String> = Vec::new();
                        if let Some(x) = x {
                            members.push(x.to_owned());
                        }
                        for (name, value) in [("held", h), ("expires_at", e), ("fencing_token", f)]
                        {
                            if let Some(value) = value {
                                members.push(format!(r#""{name}":{value}"#));
                            }
                        }
                        for reversed in [false, true] {
                            if reversed {
                                members.reverse();
                            }
                            let body = format!("{{{}}}", members.join(","));
                            let general = Fields::parse_general(body.as_bytes());
                            assert_eq!(Fields::parse(body.as_bytes()), general, "{body}");
                            if let Ok(fast) = serde_json::from_slice::<Fields>(body.as_bytes()) {
                                if !fast.has_invalid() {
                                    assert_eq!(Ok(fast), general, "{body}");
                                }
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 6 * 9 * 11 * 3 * 2);
        // Text the general reading refuses, in a member neither reads.
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for other in ["1e400", r#""\ud800""#, "\"\u{0}\"", &deep] {
            let body =
                format!(r#"{{"expires_at":"2026-07-20T14:00:10Z","fencing_token":1,"x":{other}}}"#);
            assert_eq!(
                Fields::parse(body.as_bytes()),
                Fields::parse_general(body.as_bytes()),
                "{body}"
            );
        }
        let mut invalid_utf8 = br#"{"fencing_token":1,"x":""#.to_vec();
        invalid_utf8.extend_from_slice(&[0xff, b'"', b'}']);
        assert_eq!(
            Fields::parse(&invalid_utf8),
            Err(InvalidReason::NotAnObject)
        );
        for not_an_object in ["[1]", "1", r#""x""#, "null", "{", "", r#"{"held":true} x"#] {
            assert_eq!(
                Fields::parse(not_an_object.as_bytes()),
                Err(InvalidReason::NotAnObject),
                "{not_an_object}"
            );
        }
    }

    /// The bodies the service sends are read by the fast path alone.
    #[test]
    fn service_bodies_take_the_fast_path() {
        for body in [
            r#"{"expires_at":"2026-07-20T14:00:10.123Z","fencing_token":4503599627370497}"#,
            r#"{"held":true,"expires_at":"2026-07-20T14:00:10.123Z","fencing_token":7}"#,
            r#"{"held":false}"#,
        ] {
            let fast = serde_json::from_slice::<Fields>(body.as_bytes());
            assert!(
                fast.as_ref().is_ok_and(|f| !f.has_invalid()),
                "{body}: {fast:?}"
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
